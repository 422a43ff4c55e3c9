"""A new stage kind is one registry row: a config, a run function and a row, all in this module.

The toy kind `shrink` reads an earlier policy stage's checkpoint, scales every weight by `factor` and commits the
result as the next policy; the cascade flow wires its input, runs it under the compute slot, evaluates it and
gates it, without any other file knowing the kind exists.
"""

from typing import Literal

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from cascade.stages.config_base import Read, StageConfig
from cascade.stages.context import StageContext, StageResult, load_policy, save_model_checkpoint
from cascade.stages.kinds import KINDS, StageInputs, StageKind, kind_of, register_kind, run_stage, unregister_kind
from cascade.stages.recipe import RecipeError, validate_recipe


class ShrinkConfig(StageConfig):
    kind: Literal["shrink"] = "shrink"
    name: str = "shrink"
    source: str = "sft"  # the policy stage whose checkpoint is shrunk
    factor: float = 0.5

    def reads(self) -> list[Read]:
        return [Read("source", self.source, "policy")]


def run_shrink(cfg: ShrinkConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    source = inputs.stages[cfg.source]
    model, tokenizer = load_policy(ctx, source)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(cfg.factor)
    metrics = {"factor": cfg.factor}
    ref = save_model_checkpoint(ctx, ctx.key, model, tokenizer, cfg=cfg, step=None, parent=source, metrics=metrics)
    return StageResult(ref, metrics)


@pytest.fixture
def shrink_kind():
    register_kind(StageKind("shrink", ShrinkConfig, run_shrink, makes="policy", takes_policy=False, holds_compute=True))
    yield
    unregister_kind("shrink")


def recipe_with_shrink(tmp_path):
    raw = load_recipe(
        "micro",
        [f"storage.root=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/m.db", "stages.sft.steps=3"],
    ).model_dump(mode="json")
    raw["stages"] = [s for s in raw["stages"] if s["kind"] in ("sft_data", "sft")] + [{"kind": "shrink", "factor": 0.5}]
    return validate_recipe(raw)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness", "shrink_kind")
def test_a_kind_registered_here_runs_in_the_cascade_with_real_checkpoints(tmp_path):
    recipe = recipe_with_shrink(tmp_path)
    assert isinstance(recipe.stage("shrink"), ShrinkConfig)
    report = cascade_flow(recipe, "toy")

    assert [(s["name"], s["status"]) for s in report.stages] == [
        ("sft_data", "completed"),
        ("sft", "completed"),
        ("shrink", "completed"),
    ]
    assert [e["after_stage"] for e in report.evals] == ["sft", "shrink"]  # a policy: evaluated and gated
    store = Store.from_config(recipe.storage)
    sft = load_file(store.path("runs/toy/01-sft/model/model.safetensors"))
    shrunk = load_file(store.path("runs/toy/02-shrink/model/model.safetensors"))
    assert sft.keys() == shrunk.keys()
    for name in sft:
        torch.testing.assert_close(shrunk[name], 0.5 * sft[name], rtol=0, atol=0)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(store.path("runs/toy/02-shrink/model")).num_parameters() > 0


@pytest.mark.usefixtures("shrink_kind")
def test_the_recipe_checks_what_a_new_kind_reads(tmp_path):
    raw = recipe_with_shrink(tmp_path).model_dump(mode="json")
    raw["stages"][-1]["source"] = "sft_data"  # a dataset, not a policy
    with pytest.raises(
        RecipeError, match="'shrink' reads source 'sft_data', which no earlier grpo/mopd/sft/shrink stage writes"
    ):
        validate_recipe(raw)
    raw["stages"][-1]["fator"] = 2.0
    with pytest.raises(RecipeError, match=r"stages\.2\.shrink\.fator: unknown key; did you mean 'factor'\?"):
        validate_recipe(raw)


def test_an_unknown_kind_is_an_error_everywhere():
    raw = {"domains": {"math": {}}, "stages": [{"kind": "distil", "name": "x"}]}
    with pytest.raises(RecipeError, match=r"stages\.0\.kind: unknown stage kind 'distil'; known: difficulty, grpo"):
        validate_recipe(raw)
    with pytest.raises(KeyError, match="unknown stage kind 'distil'"):
        kind_of("distil")
    with pytest.raises(KeyError, match="unknown stage kind"):
        run_stage(ShrinkConfig(), None, StageInputs())  # not registered outside the fixture
    assert "shrink" not in KINDS
