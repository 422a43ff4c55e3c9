"""The tasks around a policy: its eval (reused from the store when computed), the regression gate on it, the
teachers a stage chooses from the evals so far, and the gate's record of a recovery. No ML logic here.

The flow hands each task the typed values it needs (the eval's `EvalScores`, the evals before it, the gate's
`GateDecision`s); each writes its outcome into the run's record (`write_report`) and reads no scores back from it.
"""

from __future__ import annotations

from typing import Any

from prefect import artifacts as ui_artifacts
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.model_registry import register_stage
from cascade.artifacts.report import EvalScores, GateDecision
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker, tracking_on
from cascade.stages.errors import GateFailed
from cascade.stages.evals.evaluate import stored_or_evaluated
from cascade.stages.evals.gate import best_stages, decide, with_teachers
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.tasks.lifecycle import artifact_key, write_report
from cascade.tasks.progress import progress_for


@task(name="evaluate", cache_policy=NO_CACHE)
def eval_task(
    recipe: Recipe, run_id: str, stage: str, index: int, model: CheckpointRef | None, earlier: list[EvalScores]
) -> EvalScores:
    """Scores of every domain after a stage; reused from the store when already computed. `earlier`: the run's
    evals before this one (MLflow's step of it; the domains this stage is the best checkpoint for)."""
    store = Store.from_config(recipe.storage)
    key = layout.eval_key(run_id, index, stage)
    record, new = stored_or_evaluated(
        recipe,
        store,
        key,
        model,
        lambda part: progress_for(f"eval {stage}: {part}", "items"),
        announce=lambda line: get_run_logger().info(f"eval {stage}: {line}"),
    )
    scores = EvalScores(after_stage=stage, scores=record.scores)
    if new and tracking_on(recipe.tracking):
        tracker = Tracker(recipe, run_id)
        tracker.log_scores(len(earlier), scores.scores)
        tracker.log_eval(stage, index, scores.scores, record.items)
    write_report(recipe, run_id, lambda report: report.record_eval(stage, scores.scores))
    if tracking_on(recipe.tracking) and model is not None:
        best = [d for d, s in best_stages([*earlier, scores], list(recipe.domains)).items() if s == stage]
        try:
            register_stage(Tracker(recipe, run_id), stage, model.uri, best)
        except Exception as e:  # registry bookkeeping must never fail a training run
            get_run_logger().warning(f"model registry: {stage} not registered ({e})")
    return scores


@task(name="gate", cache_policy=NO_CACHE)
def gate_task(
    recipe: Recipe, run_id: str, scores: EvalScores, earlier: list[EvalScores], policy: str
) -> list[GateDecision]:
    """Compare `scores` with the best of the `earlier` evals per gated column; record every decision; raise under
    policy `fail`."""
    stage = scores.after_stage
    decisions = decide(stage, earlier, scores, recipe.tolerances(), policy)
    write_report(recipe, run_id, lambda report: report.record_gate(stage, decisions))
    description = f"Regression gate after stage {stage}"
    if decisions:
        ui_artifacts.create_table_artifact(_table(decisions), key=artifact_key(run_id, "gate"), description=description)
        if tracking_on(recipe.tracking):
            Tracker(recipe, run_id).set_tags({f"gate.{stage}.{d.domain}": d.action for d in decisions})
    else:  # each time the gate is evaluated its artifact says so, not only when it fires
        ui_artifacts.create_markdown_artifact(
            gate_passed(stage, earlier), key=artifact_key(run_id, "gate"), description=description
        )
    if decisions and policy == "fail":
        worst = max(decisions, key=lambda d: d.drop)
        raise GateFailed(
            f"regression gate: {worst.domain} dropped {worst.drop:.3f} after {stage} (tolerance {worst.tolerance})"
        )
    return decisions


@task(name="choose-teachers", cache_policy=NO_CACHE)
def choose_teachers_task(recipe: Recipe, cfg: StageConfig, evals: list[EvalScores]) -> StageConfig:
    """A stage that takes teachers (`teachers: auto`, or the gate's recovery) with its teachers chosen: per domain
    (cfg.domains, default every recipe domain), the stage whose checkpoint holds that domain's best dev score
    in `evals`."""
    chosen = with_teachers(cfg, recipe, evals)
    if chosen is None:
        raise ValueError(f"stage {cfg.name!r}: teachers: auto, but no domain has been evaluated before it")
    return chosen


@task(name="record-recovery", cache_policy=NO_CACHE)
def record_recovery_task(
    recipe: Recipe, run_id: str, fired: list[GateDecision], recovered: EvalScores
) -> list[GateDecision]:
    """The decisions that fired after a stage, each with the recovery's score on its column, in place of the gate's
    record of them."""
    stage, filled = fired[0].stage, [d.recovered(recovered) for d in fired]
    write_report(recipe, run_id, lambda report: report.record_gate(stage, filled))
    ui_artifacts.create_table_artifact(
        _table(filled),
        key=artifact_key(run_id, "gate"),
        description=f"Regression gate after {stage}, with the recovery's scores",
    )
    if tracking_on(recipe.tracking):
        Tracker(recipe, run_id).set_tags({f"gate.{stage}.{g.domain}.after_recovery": g.after_recovery for g in filled})
    return filled


def gate_passed(stage: str, earlier: list[EvalScores]) -> str:
    """The gate's artifact when nothing fired after `stage`: passed, against the evals before it, or nothing to
    compare with yet."""
    if not earlier:
        return f"Regression gate after `{stage}`: passed, nothing to compare with (no eval before this stage)"
    before = ", ".join(f"`{e.after_stage}`" for e in earlier)
    return (
        f"Regression gate after `{stage}`: passed, no gated domain fell more than its tolerance below its best "
        f"score so far (after {before})"
    )


def _table(decisions: list[GateDecision]) -> list[dict[str, Any]]:
    """The decisions as the rows of a Prefect table artifact."""
    return [d.model_dump() for d in decisions]
