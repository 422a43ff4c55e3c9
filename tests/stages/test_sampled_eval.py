"""A domain scored on samples (`eval_temperature`, `eval_samples`): an item's score is the mean grade of its samples,
the standard error is over items, and the eval's sampling is seeded so it depends on the checkpoint alone."""

from __future__ import annotations

import pytest

from cascade.artifacts.html_report import standard_error
from cascade.flows.recipes import load_recipe
from cascade.stages.engines.base import Completion, SamplingParams
from cascade.stages.evaluate import evaluate_domains
from cascade.stages.recipe import RecipeError
from cascade.stages.tokenizer import load_tokenizer


class ScriptedEngine:
    """Answers item i's j-th sample with the oracle's answer when j < right[i], else with a wrong one."""

    def __init__(self, references: list[str], right: list[int]):
        self.references, self.right, self.calls = references, right, []

    def generate(self, prompts, n, sampling: SamplingParams):
        self.calls.append((len(prompts), n, sampling))
        return [[Completion([], [], self.references[i] if j < self.right[i] else "no idea", "stop") for j in range(n)]
                for i in range(len(prompts))]


def test_an_items_score_is_the_mean_of_its_samples():
    recipe = load_recipe("micro", ["domains.math.heldout_size=3", "domains.math.eval_temperature=0.7",
                                   "domains.math.eval_samples=4"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 3, recipe.seed)
    engine = ScriptedEngine([it.reference for it in items], right=[1, 2, 4])
    scores, rows = evaluate_domains(engine, load_tokenizer(), recipe)
    assert [r["score"] for r in rows] == [0.25, 0.5, 1.0]
    assert scores["math"] == pytest.approx(1.75 / 3, abs=1e-12)
    # SE over the 3 items' means (sample sd 0.3819 / sqrt 3), not over the 12 samples
    assert standard_error([r["score"] for r in rows]) == pytest.approx(0.2205, abs=1e-4)
    (count, n, sampling), = engine.calls
    assert (count, n, sampling.temperature, sampling.seed) == (3, 4, 0.7, recipe.seed)


def test_greedy_by_default_with_one_answer_per_item():
    recipe = load_recipe("micro", ["domains.math.heldout_size=2"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 2, recipe.seed)
    engine = ScriptedEngine([it.reference for it in items], right=[1, 0])
    scores, _ = evaluate_domains(engine, load_tokenizer(), recipe)
    (_, n, sampling), = engine.calls
    assert (n, sampling.temperature, sampling.seed, scores["math"]) == (1, 0.0, None, 0.5)


def test_several_greedy_samples_are_refused():
    with pytest.raises(RecipeError, match="eval_samples > 1 needs eval_temperature > 0"):
        load_recipe("micro", ["domains.math.eval_samples=4"])
