"""The cascade flow: every recipe stage in order; after each model stage an eval and the regression gate.

This module only wires tasks. When the gate fires under policy `recover`, the flow branches into a MOPD
recovery task named for the stage it recovers (teachers: the best checkpoint per domain so far), evaluates
again, and continues from the recovered checkpoint. Resume is a re-run with the same run_id: stages whose
checkpoint manifest verifies are skipped, stored evals are reused, and a stage cut off mid-way continues from
its last step checkpoint.
"""

from __future__ import annotations

from prefect import flow

from artifacts.checkpoint import CheckpointRef
from artifacts.lease import Lease
from artifacts.report import RunReport
from artifacts.store import Store
from stages.recipe import MODEL_STAGE_KINDS, Recipe
from tasks.stages import (
    eval_task,
    finish_task,
    gate_task,
    plan_recovery_task,
    record_recovery_task,
    stage_task,
)


@flow(name="cascade", flow_run_name="{recipe.name}-{run_id}", log_prints=True)
def cascade_flow(recipe: Recipe, run_id: str) -> RunReport:
    models: dict[str, CheckpointRef] = {}  # stage name -> checkpoint, for teachers
    data: dict[str, CheckpointRef] = {}
    model: CheckpointRef | None = None
    recoveries = 0
    lease = Lease(Store.from_config(recipe.storage), run_id).acquire()  # one writer per run; LeaseHeld otherwise
    try:
        for index, stage in enumerate(recipe.stages):
            teachers = {d: models[s] for d, s in getattr(stage, "teachers", {}).items()}
            ref = stage_task.with_options(task_run_name=f"{index:02d}-{stage.kind}-{stage.name}")(
                recipe, run_id, stage, index, model, data, teachers
            )
            if stage.kind not in MODEL_STAGE_KINDS:
                data[stage.name] = ref
                continue
            model = models[stage.name] = ref
            if not recipe.eval.enabled:
                continue
            scores = eval_task.with_options(task_run_name=f"eval-after-{stage.name}")(
                recipe, run_id, stage.name, index, model
            )
            can_recover = recipe.gate.policy == "recover" and recoveries < recipe.gate.max_recoveries
            policy = "warn" if recipe.gate.policy == "recover" and not can_recover else recipe.gate.policy
            fired = gate_task.with_options(task_run_name=f"gate-after-{stage.name}")(
                recipe, run_id, stage.name, scores, policy
            )
            if not (fired and can_recover):
                continue
            recoveries += 1
            recovery = plan_recovery_task(recipe, run_id, stage.name)
            model = models[recovery.name] = stage_task.with_options(task_run_name=f"mopd-recover-{stage.name}")(
                recipe, run_id, recovery, index, model, data, {d: models[s] for d, s in recovery.teachers.items()}
            )
            recovered = eval_task.with_options(task_run_name=f"eval-after-recover-{stage.name}")(
                recipe, run_id, recovery.name, index, model
            )
            record_recovery_task(recipe, run_id, stage.name, recovered)
    except BaseException:
        finish_task(recipe, run_id, "FAILED")
        raise
    finally:
        lease.release()
    return finish_task(recipe, run_id, "FINISHED")
