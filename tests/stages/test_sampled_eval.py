"""A domain scored on samples (`eval_temperature`, `eval_samples`): an item's score is the mean grade of its samples,
the standard error is over items, and the eval's sampling is seeded so it depends on the checkpoint alone."""

from __future__ import annotations

import pytest

from cascade.artifacts.html_report import standard_error
from cascade.flows.recipes import load_recipe
from cascade.stages.engines.base import Completion, SamplingParams
from cascade.stages.evaluate import evaluate_domains, item_seeds
from cascade.stages.recipe import RecipeError
from cascade.stages.tokenizer import load_tokenizer


class ScriptedEngine:
    """Answers item i's j-th sample with the oracle's answer when j < right[i], else with a wrong one."""

    def __init__(self, references: list[str], right: list[int]):
        self.references, self.right, self.calls = references, right, []

    def generate(self, prompts, n, sampling: SamplingParams, seeds=None):
        self.calls.append((len(prompts), n, sampling, seeds))
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
    (count, n, sampling, seeds), = engine.calls
    assert (count, n, sampling.temperature) == (3, 4, 0.7)
    assert seeds == item_seeds(recipe.seed, "math", items) and len(set(seeds)) == 3  # each item its own stream


def test_greedy_by_default_with_one_answer_per_item():
    recipe = load_recipe("micro", ["domains.math.heldout_size=2"])
    recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
    items = recipe.domain("math").generate("heldout", 2, recipe.seed)
    engine = ScriptedEngine([it.reference for it in items], right=[1, 0])
    scores, _ = evaluate_domains(engine, load_tokenizer(), recipe)
    (_, n, sampling, _), = engine.calls
    assert (n, sampling.temperature, scores["math"]) == (1, 0.0, 0.5)


def test_several_greedy_samples_are_refused():
    with pytest.raises(RecipeError, match="eval_samples > 1 needs eval_temperature > 0"):
        load_recipe("micro", ["domains.math.eval_samples=4"])


def test_an_items_samples_do_not_depend_on_the_batch_or_on_the_other_items(monkeypatch):
    """Common random numbers: a checkpoint answers an item with the same draws whether the eval batches 1 or 64
    rows, whether the held-out set holds 3 or 6 items, and in whatever order they come, so two checkpoints' paired
    difference is theirs alone."""
    from cascade.stages.config import ModelConfig
    from cascade.stages.engines.hf import HFEngine
    from cascade.stages.model import build_tiny_model

    tok = load_tokenizer()
    model = build_tiny_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), len(tok), 0)

    def completions(size: int, batch: int, reverse: bool = False) -> dict[str, str]:
        recipe = load_recipe("micro", [f"domains.math.heldout_size={size}", "domains.math.eval_temperature=1.0",
                                       "domains.math.eval_samples=2"])
        recipe = recipe.model_copy(update={"domains": {"math": recipe.domains["math"]}})
        domain = recipe.domain("math")
        if reverse:
            forward = type(domain).generate
            monkeypatch.setattr(domain, "generate", lambda *a: list(reversed(forward(domain, *a))))
        _, rows = evaluate_domains(HFEngine(model, tok, batch_size=batch), tok, recipe)
        monkeypatch.undo()
        return {r["id"]: r["completion"] for r in rows}

    six = completions(6, 64)
    assert completions(6, 1) == six
    assert completions(6, 64, reverse=True) == six
    assert completions(3, 64).items() <= six.items()
