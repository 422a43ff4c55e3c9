"""The facts a stage-kind row owns, read by the code that treats kinds differently: the plan's estimate, whether
the gate may recover with it, whether it may run as a torchrun job; and the row's own consistency checks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

import pytest

from cascade.stages.kinds import StageKind, kind_of, recovery_kinds, register_kind, unregister_kind
from cascade.stages.recipe.config_base import StageConfig, TrainingConfig
from cascade.stages.recipe.estimate import StageEstimate
from cascade.stages.recipe.plan import ModelSize, estimate_stage
from cascade.stages.recipe.recipe_file import read_recipe_file, resolve_recipe_path
from cascade.stages.recipe.schema import RecipeError, load_recipe, validate_recipe


class NoteConfig(StageConfig):
    kind: Literal["note"] = "note"
    name: str = "note"


def no_run(cfg, ctx, inputs):
    raise AssertionError("not run here")


@pytest.fixture
def note_kind():
    yield lambda **facts: register_kind(
        StageKind("note", NoteConfig, no_run, makes="dataset", takes_policy=False, holds_compute=False, **facts)
    )
    unregister_kind("note")


def test_the_plan_estimates_a_kind_by_its_row(note_kind):
    recipe = load_recipe("micro")
    size = ModelSize(1000, 1000, from_config=False)
    note_kind()
    assert estimate_stage(NoteConfig(), recipe, size, 128).notes == ["no estimate for kind 'note'"]
    note_kind(
        estimate=lambda cfg, recipe, params, prompt_tokens: StageEstimate(
            cfg.name, cfg.kind, storage_bytes=params * prompt_tokens
        )
    )
    assert estimate_stage(NoteConfig(), recipe, size, 128).storage_bytes == 128_000


def test_the_gate_recovers_only_with_a_kind_that_recovers():
    raw = read_recipe_file(resolve_recipe_path("micro"))
    raw["gate"] = {"policy": "recover", "recovery": {"kind": "sft", "steps": 3, "warmup_steps": 1}}
    with pytest.raises(
        RecipeError,
        match=r"^recipe: gate\.recovery: a sft stage cannot recover; kinds that can: "
        rf"{', '.join(recovery_kinds())}$",
    ):
        validate_recipe(raw)
    raw["gate"] = {"policy": "recover", "recovery": {"steps": 0}}  # no kind: the default recovery's, its bounds
    with pytest.raises(RecipeError, match=r"^recipe: gate\.recovery\.\w+\.steps: Input should be greater"):
        validate_recipe(raw)
    recovery = load_recipe("tiny-regression").gate.recovery  # a shipped recovery names no kind
    assert kind_of(recovery.kind).recovers


class TrainedNote(TrainingConfig):
    kind: Literal["note"] = "note"
    name: str = "note"
    steps: int = 1
    lr: float = 0.1


def test_a_row_refuses_facts_its_config_cannot_hold():
    with pytest.raises(ValueError, match="a distributable kind needs a TrainingConfig"):
        StageKind("note", NoteConfig, no_run, makes="policy", takes_policy=True, holds_compute=True, distributable=True)
    StageKind("note", TrainedNote, no_run, makes="policy", takes_policy=True, holds_compute=True, distributable=True)
    with pytest.raises(ValueError, match="a recovery kind's config needs `teachers` and `domains`"):
        StageKind("note", TrainedNote, no_run, makes="policy", takes_policy=True, holds_compute=True, recovers=True)


def test_only_distributable_kinds_launch_torchrun(note_kind, monkeypatch):
    """A kind that is not distributable runs in-process whatever `compute` asks for."""
    from cascade.stages.scale import launch

    note_kind()
    recipe = load_recipe("micro", ["compute.nproc_per_node=2"])
    ran = []
    monkeypatch.setattr(launch, "run_stage", lambda cfg, ctx, inputs: ran.append("in-process"))
    monkeypatch.setattr(launch, "run_torchrun", lambda cfg, ctx, inputs, compute: ran.append("torchrun"))
    ctx = SimpleNamespace(recipe=recipe)
    launch.run_stage_where_configured(NoteConfig(), ctx, None)
    launch.run_stage_where_configured(recipe.stage("sft"), ctx, None)
    assert ran == ["in-process", "torchrun"]
