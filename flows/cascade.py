"""The cascade flow: every recipe stage in order, an eval and a gate check after each model stage.

This module only wires tasks. Resume is a re-run with the same run_id: stages whose checkpoint manifest
verifies are skipped, evals already stored are reused, and a stage cut off mid-way continues from its last
step checkpoint.
"""

from __future__ import annotations

from prefect import flow

from artifacts.checkpoint import CheckpointRef
from artifacts.report import RunReport
from stages.recipe import MODEL_STAGE_KINDS, Recipe
from tasks.stages import eval_task, finish_task, gate_task, stage_task


@flow(name="cascade", flow_run_name="{recipe.name}-{run_id}", log_prints=True)
def cascade_flow(recipe: Recipe, run_id: str) -> RunReport:
    model: CheckpointRef | None = None
    data: dict[str, CheckpointRef] = {}
    try:
        for index, stage in enumerate(recipe.stages):
            ref = stage_task.with_options(task_run_name=f"{index:02d}-{stage.kind}-{stage.name}")(
                recipe, run_id, index, model, data
            )
            if stage.kind not in MODEL_STAGE_KINDS:
                data[stage.name] = ref
                continue
            model = ref
            if recipe.eval.enabled:
                scores = eval_task.with_options(task_run_name=f"eval-after-{stage.name}")(recipe, run_id, index, model)
                gate_task.with_options(task_run_name=f"gate-after-{stage.name}")(recipe, run_id, index, scores)
    except BaseException:
        finish_task(recipe, run_id, "FAILED")
        raise
    return finish_task(recipe, run_id, "FINISHED")
