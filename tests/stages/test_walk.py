"""The cascade's walk (stages/recipe/walk.py): the one description of a run's shape that the flow, the stage driver, the
plan and `cascade status` read, and `Made`, what a run carries from stage to stage."""

from __future__ import annotations

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.kinds import StageInputs, kind_of
from cascade.stages.recipe.walk import GateStep, Made, SourceEval, StageStep, walk
from tests.conftest import micro_recipe

MICRO_STAGES = [(0, "sft_data"), (1, "sft"), (2, "difficulty"), (3, "if_rl"), (4, "math_rl")]


def shape(recipe) -> list[tuple]:
    out = []
    for step in walk(recipe):
        if isinstance(step, SourceEval):
            out.append(("eval", "source"))
        elif isinstance(step, StageStep):
            out.append((step.index, step.stage.name))
        else:
            out.append(("gate", step.index, step.after, step.recovery.stage.name if step.recovery else None))
    return out


def test_each_stage_in_order_then_after_each_policy_its_eval_and_gate(tmp_path):
    assert shape(micro_recipe(tmp_path)) == [
        (0, "sft_data"),
        (1, "sft"),
        ("gate", 1, "sft", None),
        (2, "difficulty"),
        (3, "if_rl"),
        ("gate", 3, "if_rl", None),
        (4, "math_rl"),
        ("gate", 4, "math_rl", None),
    ]
    assert shape(micro_recipe(tmp_path, "eval.enabled=false")) == MICRO_STAGES  # no eval: no gate either


def test_the_gate_carries_a_recovery_only_under_recover_with_recoveries_allowed(tmp_path):
    recipe = micro_recipe(tmp_path, "gate.policy=recover", "eval.source=true")
    steps = shape(recipe)
    assert steps[0] == ("eval", "source")
    assert [s for s in steps if s[0] == "gate"] == [
        ("gate", 1, "sft", "recover-sft"),
        ("gate", 3, "if_rl", "recover-if_rl"),
        ("gate", 4, "math_rl", "recover-math_rl"),
    ]
    recovery = next(s for s in walk(recipe) if isinstance(s, GateStep)).recovery
    assert recovery.recovers == "sft"
    assert recovery.stage.kind == recipe.gate.recovery.kind and recovery.stage.steps == recipe.gate.recovery.steps
    for policy in ("warn", "fail"):
        assert all(s[-1] is None for s in shape(micro_recipe(tmp_path, f"gate.policy={policy}")) if s[0] == "gate")
    none_left = micro_recipe(tmp_path, "gate.policy=recover", "gate.max_recoveries=0")
    assert all(s[-1] is None for s in shape(none_left) if s[0] == "gate")


def ref(stage: str) -> CheckpointRef:
    return CheckpointRef(uri=f"file:///s/{stage}", key=f"runs/r/{stage}", stage=stage, config_hash="0" * 16, digest="0")


def test_made_gives_each_stage_the_newest_policy_and_the_stages_it_reads(tmp_path):
    """Each stage of micro takes the newest policy where its kind starts from one, and the checkpoint of every
    stage it reads; a recovery becomes the newest policy for the stages after it."""
    recipe = micro_recipe(tmp_path, "gate.policy=recover")
    made, newest, started = Made(), None, {}
    for step in walk(recipe):
        if not isinstance(step, StageStep):
            continue
        inputs = started[step.stage.name] = made.inputs(step.stage)
        assert inputs.policy == (newest if kind_of(step.stage.kind).takes_policy else None), step.stage.name
        assert inputs.stages == {r.stage: ref(r.stage) for r in step.stage.reads()}, step.stage.name
        made.add(step.stage, ref(step.stage.name))
        if kind_of(step.stage.kind).makes == "policy":
            newest = ref(step.stage.name)
        if step.stage.name == "if_rl":  # the gate after if_rl recovers: its recovery is the policy from here on
            recovery = next(s for s in walk(recipe) if isinstance(s, GateStep) and s.after == "if_rl").recovery
            made.add(recovery.stage, newest := ref(recovery.stage.name))
    assert made.policy == ref("math_rl") and set(made.stages) == {n for _, n in MICRO_STAGES} | {"recover-if_rl"}
    assert started["math_rl"].policy == ref("recover-if_rl") and started["if_rl"].policy == ref("sft")


def test_a_distilling_stage_takes_its_teachers_by_domain_and_a_status_judge_only_those_made(tmp_path):
    """MOPD's teachers arrive by domain (the model source as None); with made_only, a teacher not made yet is left
    out, so `cascade status` judges the stage against the parents it has; every teacher counts as a parent."""
    from cascade.stages.execution import parent_change

    recipe = micro_recipe(tmp_path, "gate.recovery.teachers={math: sft, instruct: source}")
    mopd = recipe.gate.recovery
    made = Made(stages={"sft": ref("sft")}, policy=ref("sft"))
    inputs = made.inputs(mopd)
    assert inputs.teachers == {"math": ref("sft"), "instruct": None} and inputs.stages == {"sft": ref("sft")}
    later = mopd.model_copy(update={"teachers": {"math": "math_rl", "instruct": "source"}})
    assert made.inputs(later, made_only=True).teachers == {"instruct": None}
    teacher = ref("math_rl").model_copy(update={"digest": "1"})
    taught = StageInputs(policy=ref("sft"), teachers={"math": teacher, "instruct": None})
    assert taught.checkpoints() == [ref("sft"), teacher]
    assert parent_change(teacher.model_dump(), taught) is None
    moved = teacher.model_dump() | {"digest": "2"}
    assert parent_change(moved, taught) == "its parent math_rl changed (checkpoint 2, now 1)"
