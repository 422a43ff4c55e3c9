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
from cascade.artifacts.report import EvalScores, GateDecision, RunReport
from cascade.flows.recipes import RunRequest, read_store_uri, request_recipe
from cascade.infra.flow_outcomes import expected_outcomes_in_one_line
from cascade.stages.kinds import chooses_teachers
from cascade.stages.recipe.config_base import SOURCE_EVAL
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.walk import GateStep, Made, Recovery, SourceEval, StageStep, walk
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
    """The walk of the recipe (stages/recipe/walk.py): each step a task; called inside a flow. The flow holds the
    run's evals and hands them to the gate and to each choice of teachers."""
    with running(recipe, run_id) as recipe:  # one writer per run (LeaseHeld otherwise); the run's own recipe
        stage_run = stage_task.with_options(result_storage=result_storage(recipe, run_id))
        made = Made()
        recoveries = 0
        evals: list[EvalScores] = []  # every eval so far, in the walk's order
        chosen_from: list[EvalScores] = []  # `teachers: auto` chooses from the evals through the newest gate's
        _named(links_task, recipe, run_id, "links")(recipe, run_id)
        for step in walk(recipe):
            if isinstance(step, SourceEval):
                evals.append(
                    _named(eval_task, recipe, run_id, f"eval-{SOURCE_EVAL}")(recipe, run_id, SOURCE_EVAL, 0, None, [])
                )
            elif isinstance(step, StageStep):
                stage = step.stage
                if chooses_teachers(stage):
                    stage = _named(choose_teachers_task, recipe, run_id, f"teachers-{stage.name}")(
                        recipe, stage, chosen_from
                    )
                ref = _named(stage_run, recipe, run_id, f"{step.index:02d}-{stage.kind}-{stage.name}")(
                    recipe, run_id, stage, step.index, made.inputs(stage)
                )
                made.add(stage, ref)
            else:
                recovery = step.recovery if recoveries < recipe.gate.max_recoveries else None
                fired = evaluate_and_gate(recipe, run_id, step, made.policy, evals, recover=recovery is not None)
                if fired:
                    recoveries += 1
                    run_recovery(recipe, run_id, step, recovery, fired, made, evals, stage_run)
                chosen_from = list(evals)
    return finish_task(recipe, run_id, "FINISHED")


def evaluate_and_gate(
    recipe: Recipe, run_id: str, step: GateStep, policy: CheckpointRef, evals: list[EvalScores], recover: bool
) -> list[GateDecision]:
    """The eval of the policy the step's stage made (appended to `evals`), then the gate on it against the evals
    before it; returns the decisions the flow recovers from (none unless it recovers). A gate of policy `recover`
    that may not recover again (`gate.max_recoveries`) warns."""
    earlier = list(evals)
    scores = _named(eval_task, recipe, run_id, f"eval-after-{step.after}")(
        recipe, run_id, step.after, step.index, policy, earlier
    )
    evals.append(scores)
    policy_now = "warn" if recipe.gate.policy == "recover" and not recover else recipe.gate.policy
    fired = _named(gate_task, recipe, run_id, f"gate-after-{step.after}")(recipe, run_id, scores, earlier, policy_now)
    return fired if recover else []


def run_recovery(
    recipe: Recipe,
    run_id: str,
    step: GateStep,
    recovery: Recovery,
    fired: list[GateDecision],
    made: Made,
    evals: list[EvalScores],
    stage_run,
) -> None:
    """The gate's recovery stage (teachers: the best checkpoint per domain in `evals`), its eval (appended to
    `evals`) and the gate's record of it; the recovered checkpoint is the newest policy from here on."""
    stage = choose_teachers_task(recipe, recovery.stage, evals)
    ref = _named(stage_run, recipe, run_id, f"{stage.kind}-{stage.name}")(
        recipe, run_id, stage, step.index, made.inputs(stage), recovery.recovers
    )
    made.add(stage, ref)
    recovered = _named(eval_task, recipe, run_id, f"eval-after-{stage.name}")(
        recipe, run_id, stage.name, step.index, ref, list(evals)
    )
    evals.append(recovered)
    record_recovery_task(recipe, run_id, fired, recovered)
