"""Reward sources as registry rows: a Python callable with TRL's signature, weighted sums of sources, the checks a
recipe makes of them before any work, and a source registered from outside."""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace
from typing import Literal

import pytest
import torch

from cascade.stages.datasets.sources import iter_rows
from cascade.stages.domains import Item, get_domain
from cascade.stages.engines import Completion
from cascade.stages.recipe.recipe_file import read_recipe_file, resolve_recipe_path
from cascade.stages.recipe.schema import RecipeError, load_recipe, validate_recipe
from cascade.stages.scoring.reward_sources import (
    RewardSourceConfig,
    RewardSourceRow,
    register_reward_source,
    unregister_reward_source,
)
from cascade.stages.scoring.rewards import make_reward_source

CALLS: list[dict] = []


def answer_length(prompts, completions, **fields):
    """A TRL-style reward: the completion's length, and what it was called with, for the test to read."""
    CALLS.append({"prompts": prompts, "completions": completions, **fields})
    return [float(len(c)) for c in completions]


def one(prompts, completions, **fields):
    return [1.0] * len(completions)


def too_few(prompts, completions, **fields):
    return [1.0]


ODD = {"reward": 1.0}  # what odd_last answers for the last rollout


def odd_last(prompts, completions, **fields):
    return [1.0] * (len(completions) - 1) + [ODD["reward"]]


RELEASE = threading.Event()  # set by the test that waits on `hangs`, so its thread ends with the test


def hangs(prompts, completions, **fields):
    RELEASE.wait(5)
    return [1.0] * len(completions)


def exits(prompts, completions, **fields):
    sys.exit(0)


NOT_CALLABLE = 3


def completion(text: str) -> Completion:
    return Completion(token_ids=[1], logprobs=[0.0], text=text, finish_reason="stop")


def items_and_groups():
    items = [Item("math", "a", "2+2?", "4", {"answer": "4"}), Item("math", "b", "3+3?", "6", {"answer": "6"})]
    groups = [[completion("4"), completion("five")], [completion("6"), completion("")]]
    return items, groups


def rl_recipe(reward) -> dict:
    raw = read_recipe_file(resolve_recipe_path("micro"))
    raw["stages"] = [s for s in raw["stages"] if s["kind"] in ("sft_data", "sft")] + [
        {"kind": "grpo", "name": "rl", "domains": ["math"], "reward": reward}
    ]
    return raw


def test_a_callable_reward_is_called_as_trl_calls_one():
    CALLS.clear()
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": f"{__name__}:answer_length"}))
    cfg = recipe.stage("rl")
    items, groups = items_and_groups()
    rewards = make_reward_source(cfg.reward, SimpleNamespace(recipe=recipe), {}).rewards(items, groups)
    assert rewards.tolist() == [[1.0, 4.0], [1.0, 0.0]]  # [P, G]
    call = CALLS[0]
    assert call["prompts"] == ["2+2?", "2+2?", "3+3?", "3+3?"] and call["completions"] == ["4", "five", "6", ""]
    assert call["answer"] == ["4", "4", "6", "6"] and call["id"] == ["a", "a", "b", "b"]  # per-rollout item fields
    assert call["reference"] == ["4", "4", "6", "6"] and call["domain"] == ["math"] * 4


def test_prompts_in_trls_shape_need_no_graders_meta_and_their_columns_reach_the_reward(tmp_path):
    """A prompt column and any others, as TRL takes a dataset: the instruct grader reads `kind`, which these rows
    lack, so a callable reward of the stage was refused them; its function now gets each column by name."""
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "2+2?", "ground_truth": "4"}, {"prompt": "3+3?", "ground_truth": "6", "meta": {"hint": "add"}}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    raw = rl_recipe({"kind": "callable", "function": f"{__name__}:answer_length"})
    raw["stages"][-1] |= {"domains": ["instruct"], "prompts": {"instruct": [{"kind": "file", "path": str(data)}]}}
    recipe = validate_recipe(raw)
    cfg = recipe.stage("rl")
    items = [row.item for row in iter_rows(cfg, recipe, cfg.domains, oracle_domains=set())]
    CALLS.clear()
    rewards = make_reward_source(cfg.reward, SimpleNamespace(recipe=recipe), {}).rewards(
        items, [[completion("4"), completion("10")], [completion("six"), completion("")]]
    )
    assert rewards.tolist() == [[1.0, 2.0], [3.0, 0.0]]
    call = CALLS[0]
    assert call["prompts"] == ["2+2?", "2+2?", "3+3?", "3+3?"] and call["completions"] == ["4", "10", "six", ""]
    assert call["ground_truth"] == ["4", "4", "6", "6"] and call["hint"] == [None, None, "add", "add"]
    # a term that grades still reads each row's meta: the same rows are refused beside a grader
    raw["stages"][-1]["reward"] = [
        {"source": {"kind": "grader"}},
        {"source": {"kind": "callable", "function": f"{__name__}:answer_length"}},
    ]
    with pytest.raises(RecipeError) as refused:
        validate_recipe(raw)
    assert str(refused.value).endswith(
        "row 1: its meta is not what the instruct grader reads (missing field 'kind'); "
        "docs/RECIPES.md ('RL prompts from files') lists each domain's meta"
    )


def test_a_weighted_sum_adds_its_sources_rewards():
    reward = [
        {"source": {"kind": "grader"}, "weight": 0.5},
        {"source": {"kind": "callable", "function": f"{__name__}:one"}, "weight": -2},
    ]
    recipe = validate_recipe(rl_recipe(reward))
    cfg = recipe.stage("rl")
    assert cfg.model_dump()["reward"][1] == {
        "source": {"kind": "callable", "function": f"{__name__}:one", "timeout_s": 300.0},
        "weight": -2.0,
    }
    items = [get_domain("math").generate("train", 2, 0)[0]]
    source = make_reward_source(cfg.reward, SimpleNamespace(recipe=recipe), {})
    rewards = source.rewards(items, [[completion(items[0].reference), completion("no")]])
    assert rewards.tolist() == [[0.5 - 2.0, -2.0]]  # 0.5 x grade + (-2) x 1
    assert source.metrics() == {"reward_term/0:grader": 0.5, "reward_term/1:callable": 1.0}


@pytest.mark.parametrize(
    "reward, message",
    [
        (
            {"kind": "callable", "function": "no_such_module_xyz:f"},
            "stages.2.grpo.reward: reward function 'no_such_module_xyz:f': cannot import no_such_module_xyz: "
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            {"kind": "callable", "function": f"{__name__}:NOT_CALLABLE"},
            f"stages.2.grpo.reward: reward function '{__name__}:NOT_CALLABLE': "
            f"{__name__} has no callable 'NOT_CALLABLE'",
        ),
        ({"kind": "callable", "function": "no colon"}, "stages.2.grpo.reward: function: String should match pattern"),
        (
            {"kind": "callable", "function": f"{__name__}:one", "timeout_s": 0},
            "stages.2.grpo.reward: timeout_s: Input should be greater than 0",
        ),
        (
            {"kind": "nope"},
            "stages.2.grpo.reward: unknown reward source 'nope'; known: callable, grader, judge, reward_model",
        ),
        (
            [{"source": {"kind": "grader"}, "weight": True}],
            "stages.2.grpo.reward.sum.0.weight: Input should be a number",
        ),
        (
            [{"source": {"kind": "reward_model", "stage": "sft"}}],
            "stage 'rl' reads reward.0.source.stage 'sft', which no earlier reward_model stage writes",
        ),
    ],
)
def test_a_bad_reward_is_one_line_before_any_work(reward, message):
    with pytest.raises(RecipeError) as e:
        validate_recipe(rl_recipe(reward))
    assert str(e.value).startswith(f"recipe: {message}") and "\n" not in str(e.value)


def test_a_callable_that_answers_the_wrong_count_fails_in_one_line():
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": f"{__name__}:too_few"}))
    cfg = recipe.stage("rl")
    items, groups = items_and_groups()
    with pytest.raises(ValueError, match="returned 1 rewards for 4 completions"):
        make_reward_source(cfg.reward, SimpleNamespace(recipe=recipe), {}).rewards(items, groups)


@pytest.mark.parametrize(
    "reward, shown",
    [
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (float("-inf"), "-inf"),
        (1e39, "1e+39"),  # inf in float32
        (-2e6, "-2000000.0"),
        (None, "None"),
        ("high", "'high'"),
    ],
)
def test_a_callable_reward_that_is_not_finite_or_past_the_bound_fails_in_one_line(monkeypatch, reward, shown):
    """NaN trained nothing (every group flat) and the stage ended FINISHED; inf, or 1e39 (inf in float32), reached
    the loss and was blamed on top_p three steps later."""
    monkeypatch.setitem(ODD, "reward", reward)
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": f"{__name__}:odd_last"}))
    items, groups = items_and_groups()
    source = make_reward_source(recipe.stage("rl").reward, SimpleNamespace(recipe=recipe), {})
    with pytest.raises(ValueError) as e:
        source.rewards(items, groups)
    assert str(e.value) == (
        f"reward function '{__name__}:odd_last' returned {shown} for rollout 3 of 4 "
        "(a reward is a finite number of magnitude at most 1e+06)"
    )
    monkeypatch.setitem(ODD, "reward", -1e6)  # the bound itself is a reward
    assert source.rewards(items, groups).tolist() == [[1.0, 1.0], [1.0, -1e6]]


def test_a_callable_that_does_not_return_in_its_time_fails_in_one_line():
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": f"{__name__}:hangs", "timeout_s": 0.2}))
    items, groups = items_and_groups()
    source = make_reward_source(recipe.stage("rl").reward, SimpleNamespace(recipe=recipe), {})
    RELEASE.clear()
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as e:
            source.rewards(items, groups)
    finally:
        RELEASE.set()
    assert time.monotonic() - started < 2
    assert str(e.value) == f"reward function '{__name__}:hangs' did not return within 0.2 s (reward.timeout_s)"


def test_a_callable_that_exits_while_scoring_fails_in_one_line():
    """A SystemExit in the call ended `cascade run` with exit 0 mid-stage."""
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": f"{__name__}:exits"}))
    items, groups = items_and_groups()
    source = make_reward_source(recipe.stage("rl").reward, SimpleNamespace(recipe=recipe), {})
    with pytest.raises(RuntimeError) as e:
        source.rewards(items, groups)
    assert str(e.value) == f"reward function '{__name__}:exits' raised SystemExit(0) while scoring"


class ConstantReward(RewardSourceConfig):
    kind: Literal["constant"] = "constant"
    value: float = 0.25


class ConstantRewards:
    def __init__(self, cfg: ConstantReward, ctx, stages):
        self.value = cfg.value

    def rewards(self, items, groups) -> torch.Tensor:
        return torch.full((len(groups), len(groups[0])), self.value)

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


@pytest.fixture
def constant_source():
    register_reward_source(RewardSourceRow("constant", ConstantReward, ConstantRewards))
    yield
    unregister_reward_source("constant")


def test_a_source_registered_from_outside_is_one_row(constant_source):
    recipe = validate_recipe(rl_recipe({"kind": "constant", "value": 0.75}))
    cfg = recipe.stage("rl")
    items, groups = items_and_groups()
    source = make_reward_source(cfg.reward, SimpleNamespace(recipe=recipe), {})
    assert source.rewards(items, groups).tolist() == [[0.75, 0.75]] * 2


def test_every_shipped_reward_still_validates_as_before():
    rlhf = load_recipe("tiny-rlhf").stage("rlhf")
    assert rlhf.reward.kind == "reward_model" and rlhf.model_dump()["reward"] == {
        "kind": "reward_model",
        "stage": "rm",
        "length_coef": 0.5,
        "batch_size": 64,
    }


REWARDS_MODULE = """
def brevity(prompts, completions, **fields):
    return [-float(len(c)) for c in completions]
"""


@pytest.fixture
def restored_import_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))


@pytest.mark.usefixtures("restored_import_path")
def test_a_rewards_module_beside_the_recipe_file_imports_from_anywhere(tmp_path, monkeypatch):
    import yaml

    folder, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    folder.mkdir(), elsewhere.mkdir()
    (folder / "beside_recipe_rewards.py").write_text(REWARDS_MODULE)
    raw = rl_recipe({"kind": "callable", "function": "beside_recipe_rewards:brevity"})
    (folder / "mine.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(elsewhere)
    with pytest.raises(RecipeError, match="cannot import beside_recipe_rewards: ModuleNotFoundError"):
        validate_recipe(raw)  # neither on the import path nor in the working directory
    recipe = load_recipe(str(folder / "mine.yaml"))
    items, groups = items_and_groups()
    rewards = make_reward_source(recipe.stage("rl").reward, SimpleNamespace(recipe=recipe), {}).rewards(items, groups)
    assert rewards.tolist() == [[-1.0, -4.0], [-1.0, -0.0]]


@pytest.mark.usefixtures("restored_import_path")
def test_a_rewards_module_in_the_working_directory_imports(tmp_path, monkeypatch):
    """As a resume validates the run's stored recipe, with no file to look beside."""
    (tmp_path / "cwd_rewards.py").write_text(REWARDS_MODULE)
    monkeypatch.chdir(tmp_path)
    recipe = validate_recipe(rl_recipe({"kind": "callable", "function": "cwd_rewards:brevity"}))
    assert recipe.stage("rl").reward.function == "cwd_rewards:brevity"


@pytest.mark.usefixtures("restored_import_path")
def test_a_rewards_module_that_exits_at_import_is_refused_in_one_line(tmp_path, monkeypatch):
    """import_function caught Exception, not SystemExit: `cascade run` ended with exit 0 and no run."""
    (tmp_path / "exiting_rewards.py").write_text("import sys\nsys.exit(0)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeError) as e:
        validate_recipe(rl_recipe({"kind": "callable", "function": "exiting_rewards:f"}))
    assert str(e.value) == (
        "recipe: stages.2.grpo.reward: reward function 'exiting_rewards:f': cannot import exiting_rewards: "
        "SystemExit: 0"
    )
