"""Difficulty filter: keep/drop rules, the rollout cache (reruns and new thresholds sample nothing), bad config."""

import json

import pytest
import torch

import cascade.stages.domains
from cascade.artifacts.checkpoint import materialize
from cascade.artifacts.store import Store
from cascade.flows.recipes import load_recipe
from cascade.stages.domains.base import Domain, Item
from cascade.stages.engines.hf import HFEngine
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.difficulty.run_difficulty import PASS_RATES_FILE, keep_or_drop, run_difficulty
from cascade.stages.products import PROMPTS_FILE
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.model import build_tiny_model, save_hf
from cascade.stages.train.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


class EvenLength(Domain):
    """Solved when the response has an even number of characters: a random model's pass counts spread over 0..k."""

    name = "even"

    def sample(self, rng):
        return Item(self.name, "", f"Say anything, {rng.randrange(10**6)}.", "ok", {"n": 1})

    def grade(self, item, completion):
        return float(len(completion) % 2 == 0)


@pytest.fixture
def even_domain(monkeypatch):
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(EvenLength())


@pytest.fixture
def reference_dir(tmp_path):
    tok = load_tokenizer()
    save_hf(build_tiny_model(SMALL, len(tok), seed=3), tok, tmp_path / "reference")
    return tmp_path / "reference"


def recipe_for(tmp_path, reference, dtype="fp32", engine=None, **difficulty):
    return validate_recipe(
        {
            "model": SMALL.model_dump(),
            "compute": {"dtype": dtype},
            "engine": engine or {},
            "storage": {"root": f"file://{tmp_path}/store"},
            "tracking": {"enabled": False},
            "domains": {"even": {"train_size": 24, "max_new_tokens": 5}},
            "stages": [{"kind": "difficulty", "reference": str(reference), "domains": ["even"], **difficulty}],
        }
    )


def run_filter(tmp_path, reference, run_id, **difficulty):
    recipe = recipe_for(tmp_path, reference, **difficulty)
    store = Store.from_config(recipe.storage)
    (tmp_path / run_id).mkdir()
    ctx = StageContext(recipe, store, run_id, f"runs/{run_id}/00-difficulty", ListSink(), workdir=tmp_path / run_id)
    result = run_difficulty(recipe.stages[0], ctx, StageInputs())
    local = materialize(store, result.checkpoint, tmp_path / run_id / "out")
    rates = [json.loads(line) for line in (local / PASS_RATES_FILE).read_text().splitlines()]
    kept = [json.loads(line) for line in (local / PROMPTS_FILE).read_text().splitlines()]
    return result.metrics, rates, kept


def count(rates, decision):
    return sum(r["decision"] == decision for r in rates)


@pytest.mark.usefixtures("even_domain")
def test_rerun_is_served_entirely_from_the_cache(tmp_path, reference_dir, monkeypatch):
    first, rates, kept = run_filter(tmp_path, reference_dir, "a")
    assert first["prompts"] == 24 and first["rollouts"] == 24 * 8 and first["cache_hits"] == 0
    assert first["kept"] + first["dropped_solved"] + first["dropped_unsolved"] == 24 == len(rates)
    assert sorted(r["solved"] for r in rates) != [0] * 24  # the test domain spreads pass counts
    assert first["kept"] == len(kept) and {k["id"] for k in kept} == {r["id"] for r in rates if r["decision"] == "kept"}

    monkeypatch.setattr(HFEngine, "generate", lambda *a, **k: pytest.fail("a cached prompt was sampled again"))
    again, rates_again, _ = run_filter(tmp_path, reference_dir, "b")
    assert again["rollouts"] == 0 and again["cache_hits"] == again["prompts"] == 24
    assert rates_again == rates
    assert {k: v for k, v in again.items() if k not in ("seconds", "rollouts", "cache_hits")} == {
        k: v for k, v in first.items() if k not in ("seconds", "rollouts", "cache_hits")
    }


@pytest.mark.usefixtures("even_domain")
def test_bf16_rollouts_sample_a_bf16_reference_and_are_cached_apart(tmp_path, reference_dir, monkeypatch):
    """engine.rollout_dtype: compute in a bf16 recipe samples the reference in bf16; the fp32 cache of the same
    reference does not serve it (other rollouts), and its own cache serves its rerun."""
    run_filter(tmp_path, reference_dir, "fp32")
    dtypes, generate = [], HFEngine.generate
    monkeypatch.setattr(
        HFEngine,
        "generate",
        lambda self, *a, **k: dtypes.append(next(self.model.parameters()).dtype) or generate(self, *a, **k),
    )
    bf16 = {"dtype": "bf16", "engine": {"rollout_dtype": "compute"}}
    first, _, _ = run_filter(tmp_path, reference_dir, "bf16", **bf16)
    assert first["cache_hits"] == 0 and first["rollouts"] == 24 * 8
    assert dtypes and set(dtypes) == {torch.bfloat16}
    calls = len(dtypes)
    again, _, _ = run_filter(tmp_path, reference_dir, "bf16-again", **bf16)
    assert again["cache_hits"] == 24 and len(dtypes) == calls  # no engine call: its own cache served it


@pytest.mark.usefixtures("even_domain")
def test_new_threshold_and_policy_reuse_the_cache(tmp_path, reference_dir, monkeypatch):
    _, rates, _ = run_filter(tmp_path, reference_dir, "a")
    solved = [r["solved"] for r in rates]
    monkeypatch.setattr(HFEngine, "generate", lambda *a, **k: pytest.fail("a cached prompt was sampled again"))
    metrics, new_rates, kept = run_filter(tmp_path, reference_dir, "b", drop_solved_at=4, unsolved="drop")
    assert metrics["rollouts"] == 0 and metrics["cache_hits"] == 24
    assert [r["solved"] for r in new_rates] == solved
    expected_solved, expected_unsolved = sum(s >= 4 for s in solved), solved.count(0)
    assert (metrics["dropped_solved"], metrics["dropped_unsolved"]) == (expected_solved, expected_unsolved)
    assert metrics["kept"] == len(kept) == 24 - expected_solved - expected_unsolved
    assert expected_solved != sum(s >= 8 for s in solved)  # the new threshold really moved the cut
    assert all(0 < r["solved"] < 4 for r in new_rates if r["decision"] == "kept")


SOLVED = [0, 8, 3, 0, 7, 0, 1, 8, 0, 6]  # hand-built: four 0/8 prompts at 0, 3, 5, 8; solved 7-8/8 at 1, 4, 7


@pytest.mark.parametrize(
    "policy, fraction, kept_zero",
    [("keep", None, 4), ("drop", None, 0), ("keep_fraction", 0.5, 2), ("keep_fraction", 0.3, 1)],
)
def test_keep_or_drop_against_a_hand_built_table(policy, fraction, kept_zero):
    decisions = keep_or_drop(SOLVED, 7, policy, fraction, seed=0)
    assert [i for i, d in enumerate(decisions) if d == "dropped_solved"] == [1, 4, 7]
    assert [decisions[i] for i in (2, 6, 9)] == ["kept"] * 3  # 3/8, 1/8 and 6/8 are kept by every policy
    zero = [0, 3, 5, 8]
    assert sum(decisions[i] == "kept" for i in zero) == kept_zero
    assert sum(decisions[i] == "dropped_unsolved" for i in zero) == 4 - kept_zero
    assert keep_or_drop(SOLVED, 7, policy, fraction, seed=0) == decisions  # seeded


def test_keep_fraction_draw_depends_on_the_seed():
    solved = [0] * 40
    draws = {tuple(keep_or_drop(solved, 8, "keep_fraction", 0.5, seed=s)) for s in range(3)}
    assert len(draws) == 3 and all(d.count("kept") == 20 for d in draws)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["stages.difficulty.reference=sftt"], "reads reference 'sftt', which no earlier grpo/mopd/sft stage writes"),
        (["stages.difficulty.drop_solved_at=9"], "drop_solved_at must be between 1 and k=8, got 9"),
        (["stages.difficulty.unsolved=keep_fraction"], "unsolved_fraction is required with unsolved=keep_fraction"),
        (["stages.if_rl.prompts=nope"], "reads prompts 'nope', which no earlier difficulty stage writes"),
        (
            ["stages.if_rl.domains=[math]", "stages.if_rl.prompts=difficulty"],
            "trains on domain(s) ['math'] that its prompts' stage 'difficulty' does not filter",
        ),
    ],
)
def test_bad_difficulty_config_is_one_line_error(overrides, message):
    with pytest.raises(RecipeError) as err:
        load_recipe("micro", overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_reference_must_come_before_the_filter():
    raw = {
        "domains": {"math": {}},
        "stages": [{"kind": "difficulty", "domains": ["math"]}, {"kind": "sft_data"}, {"kind": "sft"}],
    }
    with pytest.raises(RecipeError, match="reads reference 'sft', which no earlier grpo/mopd/sft stage writes"):
        validate_recipe(raw)
