"""The cascade flow: every recipe stage in order; after each model stage an eval and the regression gate.

This module only wires tasks. When the gate fires under policy `recover`, the flow branches into a MOPD
recovery task named for the stage it recovers (teachers: the best checkpoint per domain so far), evaluates
again, and continues from the recovered checkpoint. Resume is a re-run with the same run_id: stages whose
checkpoint manifest verifies are skipped, stored evals are reused, and a stage cut off mid-way continues from
its last step checkpoint.

Two entry points share one loop (`run_cascade`; tasks inside, no sub-flows, so a retry of the flow run finds the
persisted stage results): `cascade_flow` takes a built Recipe (the CLI), `cascade_from_form` takes the typed run
form of the `cascade` deployment (flows.recipes.RunRequest), builds the Recipe and continues the run named by
`run_id` (default: recipe name + the flow run id, which stays the same across Retry). What a stage takes as
input (the newest policy, the checkpoints of the stages it reads) comes from the stage-kind registry.
"""

from __future__ import annotations

import posixpath

from prefect import flow
from prefect.runtime import flow_run

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.report import RunReport
from cascade.flows.recipes import RunRequest, read_store_uri, request_recipe
from cascade.stages.config import SOURCE_EVAL
from cascade.stages.kinds import chooses_teachers, kind_of, stage_inputs
from cascade.stages.recipe import Recipe
from cascade.tasks.results import result_storage
from cascade.tasks.stages import (
    choose_teachers_task,
    eval_task,
    finish_task,
    gate_task,
    links_task,
    record_recovery_task,
    running,
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
    recipe = request_recipe(request, read_uri=read_store_uri)
    return run_cascade(recipe, _form_run_id(request, recipe.name))


def _named(task, recipe: Recipe, run_id: str, what: str):
    """Task run names say the recipe, the run and the stage; results persist beside the run's checkpoints."""
    return task.with_options(task_run_name=f"{recipe.name}/{run_id}/{what}")


def run_cascade(recipe: Recipe, run_id: str) -> RunReport:
    """Every recipe stage in order, each policy-making one followed by eval and gate; called inside a flow."""
    with running(recipe, run_id) as recipe:  # one writer per run (LeaseHeld otherwise); the run's own recipe
        stage_run = stage_task.with_options(result_storage=result_storage(recipe, run_id))
        made: dict[str, CheckpointRef] = {}  # stage name -> its checkpoint, for the stages that read it
        policy: CheckpointRef | None = None
        recoveries = 0
        _named(links_task, recipe, run_id, "links")(recipe, run_id)
        evaluated: str | None = None  # the newest stage with an eval: `teachers: auto` reads the evals through it
        if recipe.eval.enabled and recipe.eval.source:
            _named(eval_task, recipe, run_id, f"eval-{SOURCE_EVAL}")(recipe, run_id, SOURCE_EVAL, 0, None)
        for index, stage in enumerate(recipe.stages):
            if chooses_teachers(stage):
                stage = _named(choose_teachers_task, recipe, run_id, f"teachers-{stage.name}")(
                    recipe, run_id, stage, evaluated
                )
            ref = _named(stage_run, recipe, run_id, f"{index:02d}-{stage.kind}-{stage.name}")(
                recipe, run_id, stage, index, stage_inputs(stage, policy, made)
            )
            made[stage.name] = ref
            if kind_of(stage.kind).makes != "policy":
                continue
            policy = ref
            if not recipe.eval.enabled:
                continue
            scores = _named(eval_task, recipe, run_id, f"eval-after-{stage.name}")(
                recipe, run_id, stage.name, index, policy
            )
            evaluated = stage.name
            can_recover = recipe.gate.policy == "recover" and recoveries < recipe.gate.max_recoveries
            policy_now = "warn" if recipe.gate.policy == "recover" and not can_recover else recipe.gate.policy
            fired = _named(gate_task, recipe, run_id, f"gate-after-{stage.name}")(
                recipe, run_id, stage.name, scores, policy_now
            )
            if not (fired and can_recover):
                continue
            recoveries += 1
            recovery = choose_teachers_task(
                recipe, run_id, recipe.gate.recovery.model_copy(update={"name": f"recover-{stage.name}"}), stage.name
            )
            policy = made[recovery.name] = _named(stage_run, recipe, run_id, f"{recovery.kind}-{recovery.name}")(
                recipe, run_id, recovery, index, stage_inputs(recovery, policy, made)
            )
            recovered = _named(eval_task, recipe, run_id, f"eval-after-recover-{stage.name}")(
                recipe, run_id, recovery.name, index, policy
            )
            record_recovery_task(recipe, run_id, stage.name, recovered)
            evaluated = recovery.name
    return finish_task(recipe, run_id, "FINISHED")
