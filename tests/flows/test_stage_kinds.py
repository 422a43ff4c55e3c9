"""A new stage kind is one folder: tests/flows/toy_kinds/shrink/ holds its config, its row and its run function.

The toy kind `shrink` reads an earlier policy stage's checkpoint, scales every weight by `factor` and commits the
result as the next policy. Its folder is loaded as the built-in kinds' folders are (`load_kinds`); the cascade
flow then wires its input, runs it under the compute slot, evaluates it and gates it, without any other file
knowing the kind exists.
"""

import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.flows.recipes import load_recipe
from cascade.stages.kinds import KINDS, StageInputs, kind_of, run_stage, unregister_kind
from cascade.stages.kinds.registry import load_kinds
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from tests.flows import toy_kinds

SHRINK = f"{toy_kinds.__name__}.shrink"


@pytest.fixture
def shrink_kind():
    """The folder loaded (a fresh import: its row registers itself again); the row gone afterwards."""
    for module in (SHRINK, f"{SHRINK}.run_shrink"):
        sys.modules.pop(module, None)
    load_kinds(toy_kinds.__name__, toy_kinds.__path__)
    yield sys.modules[SHRINK]
    unregister_kind("shrink")


def recipe_with_shrink(tmp_path):
    raw = load_recipe(
        "micro",
        [f"storage.root=file://{tmp_path}/store", f"tracking.uri=sqlite:///{tmp_path}/m.db", "stages.sft.steps=3"],
    ).model_dump(mode="json")
    raw["stages"] = [s for s in raw["stages"] if s["kind"] in ("sft_data", "sft")] + [{"kind": "shrink", "factor": 0.5}]
    return validate_recipe(raw)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_a_kind_from_its_folder_runs_in_the_cascade_with_real_checkpoints(tmp_path, shrink_kind):
    recipe = recipe_with_shrink(tmp_path)
    assert isinstance(recipe.stage("shrink"), shrink_kind.ShrinkConfig)
    report = cascade_flow(recipe, "toy")

    assert [(s.name, s.status) for s in report.stages] == [
        ("sft_data", "completed"),
        ("sft", "completed"),
        ("shrink", "completed"),
    ]
    assert [e.after_stage for e in report.evals] == ["sft", "shrink"]  # a policy: evaluated and gated
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
        run_stage(SimpleNamespace(kind="shrink"), None, StageInputs())  # not registered outside the fixture
    assert "shrink" not in KINDS
