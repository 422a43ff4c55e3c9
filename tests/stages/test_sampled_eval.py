"""The eval's primary metric (`eval_temperature`, `eval_samples`): an item's score is the mean grade of its samples,
greedy pass@1 is scored beside it, the standard error is over items, and the eval's sampling is seeded so it depends
on the checkpoint alone; a domain's `eval_reward` scores every column in its grader's place."""

from __future__ import annotations

import pytest

from cascade.artifacts.html_report import standard_error
from cascade.flows.recipes import load_recipe
from cascade.stages.engines.interface import Completion, SamplingParams
from cascade.stages.evals.evaluate import evaluate_domains, item_seeds
from cascade.stages.recipe.schema import RecipeError
from cascade.stages.train.tokenizer import load_tokenizer
from tests.conftest import DEVICES


class ScriptedEngine:
    """Answers item i's j-th sample with the oracle's answer when j < right[i], else with a wrong one."""

    def __init__(self, references: list[str], right: list[int]):
        self.references, self.right, self.calls = references, right, []

    def generate(self, prompts, n, sampling: SamplingParams, seeds=None, progress=None):
        self.calls.append((len(prompts), n, sampling, seeds))
        if progress:
            progress(len(prompts), len(prompts))
        return [
            [Completion([], [], self.references[i] if j < self.right[i] else "no idea", "stop") for j in range(n)]
            for i in range(len(prompts))
        ]


def test_an_items_score_is_the_mean_of_its_samples_with_greedy_beside_it():
    recipe = load_recipe(
        "micro", ["domains.math.heldout_size=3", "domains.math.eval_temperature=0.7", "domains.math.eval_samples=4"]
    )
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 3, recipe.seed)
    engine = ScriptedEngine([it.reference for it in items], right=[1, 2, 4])
    scores, rows = evaluate_domains(engine, load_tokenizer(), recipe)
    sampled = [r["score"] for r in rows if r["domain"] == "math"]
    assert sampled == [0.25, 0.5, 1.0]
    assert scores["math"] == pytest.approx(1.75 / 3, abs=1e-12)
    # SE over the 3 items' means (sample sd 0.3819 / sqrt 3), not over the 12 samples
    assert standard_error(sampled) == pytest.approx(0.2205, abs=1e-4)
    (count, n, sampling, seeds), (_, greedy_n, greedy, greedy_seeds), dev_call = engine.calls
    assert (count, n, sampling.temperature) == (3, 4, 0.7)
    assert seeds == item_seeds(recipe.seed, "math", items) and len(set(seeds)) == 3  # each item its own stream
    # greedy beside it: one answer per item at T = 0 (the scripted first answer is right for every item)
    assert (greedy_n, greedy.temperature, scores["greedy/math"]) == (1, 0.0, 1.0)
    assert [r["score"] for r in rows if r["domain"] == "greedy/math"] == [1.0, 1.0, 1.0]
    # pass@4 of the same 4 answers: every item has a right one; no other answers were drawn for it
    assert scores["pass@4/math"] == 1.0 and [r["score"] for r in rows if r["domain"] == "pass@4/math"] == [1.0] * 3
    # and the primary metric once more on the dev split: the column that selects (dev/math); no pass@k beside it
    assert dev_call[:3] == (3, 4, sampling) and "dev/math" in scores and "pass@4/dev/math" not in scores
    assert {r["id"] for r in rows if r["domain"] == "dev/math"} == {f"math-dev-{i}" for i in range(3)}


def test_pass_at_k_counts_an_item_with_any_fully_right_answer():
    """Right answers 0, 1 and 3 of 4: mean grades 0, 0.25, 0.75, pass@4 0, 1, 1."""
    recipe = load_recipe("micro", ["domains.math.heldout_size=3", "domains.math.eval_samples=4"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 3, recipe.seed)
    scores, rows = evaluate_domains(
        ScriptedEngine([it.reference for it in items], right=[0, 1, 3]), load_tokenizer(), recipe
    )
    assert [r["score"] for r in rows if r["domain"] == "math"] == [0.0, 0.25, 0.75]
    assert [r["score"] for r in rows if r["domain"] == "pass@4/math"] == [0.0, 1.0, 1.0]
    assert scores["pass@4/math"] == pytest.approx(2 / 3)


def test_the_primary_metric_samples_at_the_temperature_rl_trains_the_domain_at():
    """Unset, eval_temperature is the first RL stage's on the domain (1.0 without one) and k is 4."""
    recipe = load_recipe("micro", ["stages.math_rl.temperature=0.6"])
    assert recipe.eval_sampling("math") == (0.6, 4)
    assert recipe.eval_sampling("instruct") == (1.0, 4)  # if_rl's default temperature
    assert load_recipe("micro", ["domains.math.eval_temperature=0.9"]).eval_sampling("math") == (0.9, 4)
    greedy = load_recipe("micro", ["domains.math.eval_temperature=0"])
    assert greedy.eval_sampling("math") == (0.0, 1)
    recipe = greedy.model_copy(update={"domains": {"math": greedy.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 16, recipe.seed)
    engine = ScriptedEngine([it.reference for it in items], right=[1, 0] * 8)
    scores, _ = evaluate_domains(engine, load_tokenizer(), recipe)
    (_, n, sampling, _), (_, dev_n, dev_sampling, _) = engine.calls  # greedy only: no greedy column beside it
    assert (n, sampling.temperature, scores["math"]) == (1, 0.0, 0.5)
    assert (dev_n, dev_sampling.temperature, set(scores)) == (1, 0.0, {"math", "dev/math"})


def test_several_greedy_samples_are_refused():
    with pytest.raises(RecipeError, match="eval_samples > 1 needs eval_temperature > 0"):
        load_recipe("micro", ["domains.math.eval_samples=4", "domains.math.eval_temperature=0"])


def test_the_dev_split_is_what_eval_split_dev_reads():
    recipe = load_recipe("micro", ["eval.split=dev", "domains.math.eval_temperature=0"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    engine = ScriptedEngine(["x"] * 16, right=[0] * 16)
    _, rows = evaluate_domains(engine, load_tokenizer(), recipe)
    dev = {it.id for it in recipe.domain("math").generate("dev", 16, recipe.seed)}
    assert {r["id"] for r in rows} == dev and all(i.startswith("math-dev-") for i in dev)
    assert {r["domain"] for r in rows} == {"math"}  # the eval's own column is dev: no dev/ column beside it


def test_an_items_samples_do_not_depend_on_the_batch_or_on_the_other_items(monkeypatch):
    """Common random numbers: a checkpoint answers an item with the same draws whether the eval batches 1 or 64
    rows, whether the held-out set holds 3 or 6 items, and in whatever order they come, so two checkpoints' paired
    difference is theirs alone."""
    from cascade.stages.engines.hf import HFEngine
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model

    tok = load_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), len(tok), 0)

    def completions(size: int, batch: int, reverse: bool = False) -> dict[str, str]:
        recipe = load_recipe(
            "micro",
            [f"domains.math.heldout_size={size}", "domains.math.eval_temperature=1.0", "domains.math.eval_samples=2"],
        )
        recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
        domain = recipe.domain("math")
        if reverse:
            forward = type(domain).generate
            monkeypatch.setattr(domain, "generate", lambda *a: list(reversed(forward(domain, *a))))
        _, rows = evaluate_domains(HFEngine(model, tok, batch_size=batch), tok, recipe)
        monkeypatch.undo()
        return {r["id"]: r["completion"] for r in rows if r["domain"] == "math"}  # the sampled column

    six = completions(6, 64)
    assert completions(6, 1) == six
    assert completions(6, 64, reverse=True) == six
    assert completions(3, 64).items() <= six.items()


@pytest.mark.parametrize("device", DEVICES)
def test_the_eval_samples_where_the_stages_train(device):
    """A recipe that trains on a GPU evaluates there too (the eval once stayed on the CPU whatever compute said)."""
    from cascade.stages.evals.evaluate import open_policy

    recipe = load_recipe("micro", [f"compute.device={device}"])
    _, engine = open_policy(recipe)
    try:
        assert next(engine.model.parameters()).device.type == device
    finally:
        engine.close()


def test_every_column_of_every_split_reports_its_progress():
    """A real model's dev split takes minutes: each column says how far it is, as the benchmarks do."""
    recipe = load_recipe("micro", ["domains.math.heldout_size=3", "domains.math.eval_temperature=0"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    engine = ScriptedEngine(["x"] * 3, right=[0, 0, 0])
    seen = []
    evaluate_domains(engine, load_tokenizer(), recipe, progress=lambda part: lambda d, t: seen.append((part, d, t)))
    assert seen == [("math", 3, 3), ("dev/math", 3, 3)]


FIELDS: list[dict] = []


def no_idea_scores(prompts, completions, **fields):
    """A reward of one's own that the grader would not give: 1.0 to "no idea", 0.25 to anything else."""
    FIELDS.append(fields)
    return [1.0 if c == "no idea" else 0.25 for c in completions]


def twice(prompts, completions, **fields):
    return [2.0] * len(completions)


def reward_recipe(function: str):
    recipe = load_recipe(
        "micro",
        [
            "domains.math.heldout_size=3",
            "domains.math.eval_samples=2",
            f"domains.math.eval_reward={{kind: callable, function: '{__name__}:{function}'}}",
        ],
    )
    return recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})


def test_a_domains_eval_scores_with_the_reward_its_eval_reward_names():
    """Right answers 0, 1 and 2 of 2: the grader scores 0, 0.5 and 1; the reward 1, 0.625 and 0.25, in every
    column, and it reads the eval items' own fields (math: `answer`)."""
    recipe = reward_recipe("no_idea_scores")
    items = recipe.domain("math").generate("heldout", 3, recipe.seed)
    FIELDS.clear()
    scores, rows = evaluate_domains(
        ScriptedEngine([it.reference for it in items], right=[0, 1, 2]), load_tokenizer(), recipe
    )
    assert [r["score"] for r in rows if r["domain"] == "math"] == [1.0, 0.625, 0.25]
    assert [r["score"] for r in rows if r["domain"] == "greedy/math"] == [1.0, 0.25, 0.25]
    assert [r["score"] for r in rows if r["domain"] == "pass@2/math"] == [1.0, 1.0, 0.0]
    assert scores["math"] == pytest.approx(1.875 / 3) and scores["dev/math"] == pytest.approx(1.875 / 3)
    assert FIELDS[0]["answer"] == [it.meta["answer"] for it in items for _ in range(2)]
    assert FIELDS[0]["id"] == [it.id for it in items for _ in range(2)]


def test_an_eval_reward_outside_0_1_fails_in_one_line():
    recipe = reward_recipe("twice")
    with pytest.raises(ValueError) as e:
        evaluate_domains(ScriptedEngine(["x"] * 3, right=[0, 0, 0]), load_tokenizer(), recipe)
    assert str(e.value) == (
        f"reward function '{__name__}:twice' returned 2.0 for eval answer 0 of 6 (an eval scores in [0, 1])"
    )
