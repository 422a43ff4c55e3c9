"""The cascade flow: every recipe stage in order; after each model stage an eval and the regression gate.

This module only wires tasks. When the gate fires under policy `recover`, the flow branches into a MOPD
recovery task named for the stage it recovers (teachers: the best checkpoint per domain so far), evaluates
again, and continues from the recovered checkpoint. Resume is a re-run with the same run_id: stages whose
checkpoint manifest verifies are skipped, stored evals are reused, and a stage cut off mid-way continues from
its last step checkpoint.

Two entry points share one loop (`run_cascade`; tasks inside, no sub-flows, so a retry of the flow run finds the
persisted stage results): `cascade_flow` takes a built Recipe (the CLI), `cascade_from_form` takes the typed run
form of the `cascade` deployment (stages.recipe.RunRequest), builds the Recipe and continues the run named by
`run_id` (default: recipe name + the flow run id, which stays the same across Retry).
"""

from __future__ import annotations

import json
import posixpath

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from artifacts.checkpoint import CheckpointRef
from artifacts.lease import Lease
from artifacts.report import RunReport
from artifacts.store import Store
from stages.recipe import MODEL_STAGE_KINDS, Recipe, RunRequest, StorageConfig, request_recipe, validate_recipe
from tasks.stages import (
    eval_task,
    finish_task,
    gate_task,
    links_task,
    plan_recovery_task,
    record_recovery_task,
    result_storage,
    stage_task,
)


@flow(name="cascade", flow_run_name="{recipe.name}-{run_id}", log_prints=True)
def cascade_flow(recipe: Recipe, run_id: str) -> RunReport:
    return run_cascade(recipe, run_id)


def _form_run_id(request: RunRequest, recipe_name: str) -> str:
    return request.run_id or f"{recipe_name}-{flow_run.id[:8]}"


def _form_run_name() -> str:
    request = RunRequest.model_validate(flow_run.parameters.get("request") or {})
    name = posixpath.splitext(posixpath.basename(request.recipe_uri))[0] if request.recipe_uri else request.recipe
    return request.run_id or _form_run_id(request, name)


@flow(name="cascade", flow_run_name=_form_run_name, log_prints=True)
def cascade_from_form(request: RunRequest = RunRequest()) -> RunReport:
    """Run a recipe from the deployment's run form; with the run_id of an earlier run, continue that run."""
    recipe = request_recipe(request, read_uri=_read_uri)
    run_id = _form_run_id(request, recipe.name)
    store = Store.from_config(recipe.storage)
    key = f"runs/{run_id}/recipe.json"
    if store.exists(key):  # a resume (or a Retry of this flow run): the run's own recipe, not the form's
        recipe = validate_recipe(json.loads(store.read_bytes(key)), source=store.uri(key))
        get_run_logger().info(f"continuing run {run_id} with its stored recipe {store.uri(key)}")
    else:
        store.write_bytes(key, recipe.model_dump_json(indent=1).encode())
    return run_cascade(recipe, run_id)


def _read_uri(uri: str) -> bytes:
    parent, name = uri.rstrip("/").rsplit("/", 1)
    return Store.from_config(StorageConfig(root=parent)).read_bytes(name)


def _named(task, recipe: Recipe, run_id: str, what: str):
    """Task run names say the recipe, the run and the stage; results persist beside the run's checkpoints."""
    return task.with_options(task_run_name=f"{recipe.name}/{run_id}/{what}")


def run_cascade(recipe: Recipe, run_id: str) -> RunReport:
    """Every recipe stage in order, each followed by eval and gate; called inside a flow."""
    stage_run = stage_task.with_options(result_storage=result_storage(recipe, run_id))
    models: dict[str, CheckpointRef] = {}  # stage name -> checkpoint, for teachers
    data: dict[str, CheckpointRef] = {}
    model: CheckpointRef | None = None
    recoveries = 0
    lease = Lease(Store.from_config(recipe.storage), run_id).acquire()  # one writer per run; LeaseHeld otherwise
    try:
        _named(links_task, recipe, run_id, "links")(recipe, run_id)
        for index, stage in enumerate(recipe.stages):
            teachers = {d: models[s] for d, s in getattr(stage, "teachers", {}).items()}
            ref = _named(stage_run, recipe, run_id, f"{index:02d}-{stage.kind}-{stage.name}")(
                recipe, run_id, stage, index, model, data, teachers
            )
            if stage.kind not in MODEL_STAGE_KINDS:
                data[stage.name] = ref
                continue
            model = models[stage.name] = ref
            if not recipe.eval.enabled:
                continue
            scores = _named(eval_task, recipe, run_id, f"eval-after-{stage.name}")(
                recipe, run_id, stage.name, index, model
            )
            can_recover = recipe.gate.policy == "recover" and recoveries < recipe.gate.max_recoveries
            policy = "warn" if recipe.gate.policy == "recover" and not can_recover else recipe.gate.policy
            fired = _named(gate_task, recipe, run_id, f"gate-after-{stage.name}")(
                recipe, run_id, stage.name, scores, policy
            )
            if not (fired and can_recover):
                continue
            recoveries += 1
            recovery = plan_recovery_task(recipe, run_id, stage.name)
            model = models[recovery.name] = _named(stage_run, recipe, run_id, f"mopd-recover-{stage.name}")(
                recipe, run_id, recovery, index, model, data, {d: models[s] for d, s in recovery.teachers.items()}
            )
            recovered = _named(eval_task, recipe, run_id, f"eval-after-recover-{stage.name}")(
                recipe, run_id, recovery.name, index, model
            )
            record_recovery_task(recipe, run_id, stage.name, recovered)
    except BaseException:
        finish_task(recipe, run_id, "FAILED")
        raise
    finally:
        lease.release()
    return finish_task(recipe, run_id, "FINISHED")
