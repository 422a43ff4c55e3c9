"""The cascade flow: the recipe's walk (stages/recipe/walk.py) as tasks: every stage in order; after each policy an eval
and the regression gate.

This module only wires tasks; the walk decides the shape. When the gate fires under policy `recover`, the flow
runs the recovery stage the walk names for the stage it recovers (teachers: the best checkpoint per domain so
far), evaluates again, and continues from the recovered checkpoint. Resume is a re-run with the same run_id:
stages whose checkpoint manifest verifies are skipped, stored evals are reused, and a stage cut off mid-way
continues from its last step checkpoint.

Two entry points share one loop (`run_cascade`; tasks inside, no sub-flows, so a retry of the flow run finds the
persisted stage results): `cascade_flow` takes a built Recipe (the CLI), `cascade_from_form` takes the typed run
form of the `cascade` deployment (flows.recipes.RunRequest), builds the Recipe and continues the run named by
`run_id` (default: recipe name + the flow run id, which stays the same across Retry). What a stage takes as
input (the newest policy, the checkpoints of the stages it reads) comes from the walk's `Made`.
"""

from __future__ import annotations

import posixpath

from prefect import flow
from prefect.runtime import flow_run

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.report import RunReport
from cascade.flows.recipes import RunRequest, read_store_uri, request_recipe
from cascade.infra.flow_outcomes import expected_outcomes_in_one_line
from cascade.stages.kinds import chooses_teachers
from cascade.stages.recipe.config_base import SOURCE_EVAL, StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.walk import GateStep, Made, SourceEval, StageStep, walk
from cascade.tasks.evals import choose_teachers_task, eval_task, gate_task, record_recovery_task
from cascade.tasks.lifecycle import finish_task, links_task, running
from cascade.tasks.results import result_storage
from cascade.tasks.stage import stage_task


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
    """Run a recipe from the deployment's run form; with the run_id of an earlier run, continue that run. A form the
    recipe refuses ends the flow run Failed in one line."""
    expected_outcomes_in_one_line()
    recipe = request_recipe(request, read_uri=read_store_uri)
    return run_cascade(recipe, _form_run_id(request, recipe.name))


def _named(task, recipe: Recipe, run_id: str, what: str):
    """Task run names say the recipe, the run and the stage; results persist beside the run's checkpoints."""
    return task.with_options(task_run_name=f"{recipe.name}/{run_id}/{what}")


def run_cascade(recipe: Recipe, run_id: str) -> RunReport:
    """The walk of the recipe (stages/recipe/walk.py): each step a task; called inside a flow."""
    with running(recipe, run_id) as recipe:  # one writer per run (LeaseHeld otherwise); the run's own recipe
        stage_run = stage_task.with_options(result_storage=result_storage(recipe, run_id))
        made = Made()
        recoveries = 0
        evaluated: str | None = None  # the newest stage with an eval: `teachers: auto` reads the evals through it
        _named(links_task, recipe, run_id, "links")(recipe, run_id)
        for step in walk(recipe):
            if isinstance(step, SourceEval):
                _named(eval_task, recipe, run_id, f"eval-{SOURCE_EVAL}")(recipe, run_id, SOURCE_EVAL, 0, None)
            elif isinstance(step, StageStep):
                stage = step.stage
                if chooses_teachers(stage):
                    stage = _named(choose_teachers_task, recipe, run_id, f"teachers-{stage.name}")(
                        recipe, run_id, stage, evaluated
                    )
                ref = _named(stage_run, recipe, run_id, f"{step.index:02d}-{stage.kind}-{stage.name}")(
                    recipe, run_id, stage, step.index, made.inputs(stage)
                )
                made.add(stage, ref)
            else:
                recovery = step.recovery if recoveries < recipe.gate.max_recoveries else None
                evaluated = step.after
                if evaluate_and_gate(recipe, run_id, step, made.policy, recover=recovery is not None):
                    recoveries += 1
                    evaluated = run_recovery(recipe, run_id, step, recovery, made, stage_run)
    return finish_task(recipe, run_id, "FINISHED")


def evaluate_and_gate(recipe: Recipe, run_id: str, step: GateStep, policy: CheckpointRef, recover: bool) -> bool:
    """The eval of the policy the step's stage made, then the gate; True: it fired and the flow recovers. A gate
    of policy `recover` that may not recover again (`gate.max_recoveries`) warns."""
    scores = _named(eval_task, recipe, run_id, f"eval-after-{step.after}")(
        recipe, run_id, step.after, step.index, policy
    )
    policy_now = "warn" if recipe.gate.policy == "recover" and not recover else recipe.gate.policy
    fired = _named(gate_task, recipe, run_id, f"gate-after-{step.after}")(
        recipe, run_id, step.after, scores, policy_now
    )
    return bool(fired) and recover


def run_recovery(recipe: Recipe, run_id: str, step: GateStep, recovery: StageConfig, made: Made, stage_run) -> str:
    """The gate's recovery stage (teachers: the best checkpoint per domain so far), its eval and the gate's record of
    it; the recovered checkpoint is the newest policy from here on. Returns the recovery's name."""
    recovery = choose_teachers_task(recipe, run_id, recovery, step.after)
    ref = _named(stage_run, recipe, run_id, f"{recovery.kind}-{recovery.name}")(
        recipe, run_id, recovery, step.index, made.inputs(recovery)
    )
    made.add(recovery, ref)
    recovered = _named(eval_task, recipe, run_id, f"eval-after-{recovery.name}")(
        recipe, run_id, recovery.name, step.index, ref
    )
    record_recovery_task(recipe, run_id, step.after, recovered)
    return recovery.name
