"""Thin Prefect tasks around the stages: skip what is committed, track, record. No ML logic here."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from prefect import artifacts as ui_artifacts
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from artifacts.checkpoint import CheckpointRef, committed
from artifacts.report import RunReport
from artifacts.store import Store
from artifacts.tracking import Tracker, register_stage
from stages.context import ListSink, StageContext
from stages.dispatch import run_stage, stage_key
from stages.evaluate import run_evaluate
from stages.gate import best_stages, decide
from stages.recipe import MOPDConfig, Recipe, StageConfig, config_hash
from tasks.progress import progress_for


def open_report(recipe: Recipe, run_id: str) -> tuple[Store, RunReport]:
    store = Store.from_config(recipe.storage)
    return store, RunReport.load(store, run_id) or RunReport(run_id=run_id, recipe=recipe.name)


@task(name="stage", cache_policy=NO_CACHE)
def stage_task(
    recipe: Recipe, run_id: str, cfg: StageConfig, index: int, model: CheckpointRef | None,
    data: dict[str, CheckpointRef], teachers: dict[str, CheckpointRef],
) -> CheckpointRef:
    """Run one stage (a recipe stage, or a gate's recovery stage at the index of the stage it recovers)."""
    store, report = open_report(recipe, run_id)
    key = stage_key(run_id, index, cfg.name)
    done = committed(store, key)
    if done is not None and done.config_hash == config_hash(cfg):
        entry = next((s for s in report.stages if s["name"] == cfg.name), {})
        report.record_stage({**entry, "name": cfg.name, "kind": cfg.kind, "status": "skipped", "checkpoint": done.uri})
        report.save(store)
        return done
    tracker = Tracker(recipe, run_id) if recipe.tracking.enabled else None
    sink = tracker.stage_sink(cfg.name) if tracker else ListSink()
    ctx = StageContext(recipe, store, run_id, key, sink, progress=progress_for(f"{index:02d} {cfg.kind}:{cfg.name}"))
    started = time.time()
    try:
        result = run_stage(cfg, ctx, model, data, teachers)
    except BaseException:
        _record(store, report, cfg, "failed", None, time.time() - started, {})
        if tracker:
            tracker.end_stage(sink, {}, "FAILED")
        raise
    plots = {name: f"{result.checkpoint.uri}/{path}" for name, path in result.plots.items()}
    _record(store, report, cfg, "completed", result.checkpoint.uri, time.time() - started, result.metrics, plots)
    if tracker:
        try:
            tracker.log_checkpoint_files(sink, store, result.checkpoint.key, list(result.plots.values()))
        except Exception as e:  # the checkpoint is committed; a lost plot must not fail the stage
            get_run_logger().warning(f"MLflow: plots of {cfg.name} not logged ({e})")
        tracker.end_stage(sink, result.metrics, "FINISHED")
    return result.checkpoint


def _record(store: Store, report: RunReport, cfg, status: str, uri: str | None, seconds: float, metrics: dict,
            plots: dict[str, str] | None = None) -> None:
    """plots: name -> store URI of an image in the stage's checkpoint."""
    report.record_stage({"name": cfg.name, "kind": cfg.kind, "status": status, "checkpoint": uri,
                         "seconds": round(seconds, 1), "metrics": metrics, **({"plots": plots} if plots else {})})
    report.save(store)


@task(name="evaluate", cache_policy=NO_CACHE)
def eval_task(recipe: Recipe, run_id: str, stage: str, index: int, model: CheckpointRef | None) -> dict[str, float]:
    """Scores of every domain after a stage; reused from the store when already computed."""
    store, report = open_report(recipe, run_id)
    key = f"runs/{run_id}/evals/{index:02d}-{stage}.json"
    digest = model.digest if model else None
    stored = json.loads(store.read_bytes(key)) if store.exists(key) else None
    if stored is not None and stored.get("digest") == digest:  # a re-trained stage must be re-evaluated
        scores = stored["scores"]
    else:
        ctx = StageContext(recipe, store, run_id, stage_key(run_id, index, stage), ListSink())
        scores, rows = run_evaluate(ctx, model)
        record = {"model": model.uri if model else None, "digest": digest, "scores": scores, "items": rows}
        store.write_bytes(key, json.dumps(record).encode())
        if recipe.tracking.enabled:
            tracker = Tracker(recipe, run_id)
            tracker.log_scores(len(report.evals), scores)
            tracker.log_eval(stage, index, scores, rows)
    report.record_eval(stage, scores)
    report.save(store)
    if recipe.tracking.enabled and model is not None:
        best = [d for d, s in best_stages(report.evals_through(stage), list(recipe.domains)).items() if s == stage]
        try:
            register_stage(Tracker(recipe, run_id), stage, model.uri, best)
        except Exception as e:  # registry bookkeeping must never fail a training run
            get_run_logger().warning(f"model registry: {stage} not registered ({e})")
    return scores


@task(name="gate", cache_policy=NO_CACHE)
def gate_task(recipe: Recipe, run_id: str, stage: str, scores: dict[str, float], policy: str) -> list[dict[str, Any]]:
    """Compare with the best score so far per domain; record every decision; raise under policy `fail`."""
    store, report = open_report(recipe, run_id)
    earlier = [e for e in report.evals_through(stage) if e["after_stage"] != stage]
    tolerances = {d: spec.tolerance for d, spec in recipe.domains.items()}
    decisions = decide(stage, earlier, scores, tolerances, policy)
    report.gate = [g for g in report.gate if g["stage"] != stage] + decisions
    report.save(store)
    if decisions:
        ui_artifacts.create_table_artifact(decisions, key=_artifact_key(run_id, "gate"),
                                           description=f"Regression gate after stage {stage}")
        if recipe.tracking.enabled:
            Tracker(recipe, run_id).set_tags({f"gate.{stage}.{d['domain']}": d["action"] for d in decisions})
    if decisions and policy == "fail":
        worst = max(decisions, key=lambda d: d["drop"])
        raise GateFailed(f"regression gate: {worst['domain']} dropped {worst['drop']:.3f} after {stage} "
                         f"(tolerance {worst['tolerance']})")
    return decisions


@task(name="plan-recovery", cache_policy=NO_CACHE)
def plan_recovery_task(recipe: Recipe, run_id: str, stage: str) -> MOPDConfig:
    """The recovery MOPD stage: teacher per domain = the stage holding that domain's best score so far."""
    _, report = open_report(recipe, run_id)
    teachers = best_stages(report.evals_through(stage), list(recipe.domains))
    return recipe.gate.recovery.model_copy(update={"name": f"recover-{stage}", "teachers": teachers})


@task(name="record-recovery", cache_policy=NO_CACHE)
def record_recovery_task(recipe: Recipe, run_id: str, stage: str, scores: dict[str, float]) -> list[dict[str, Any]]:
    store, report = open_report(recipe, run_id)
    for decision in report.gate:
        if decision["stage"] == stage:
            decision["after_recovery"] = scores[decision["domain"]]
    report.save(store)
    fired = [g for g in report.gate if g["stage"] == stage]
    ui_artifacts.create_table_artifact(fired, key=_artifact_key(run_id, "gate"),
                                       description=f"Regression gate after {stage}, with MOPD recovery scores")
    if recipe.tracking.enabled:
        Tracker(recipe, run_id).set_tags({f"gate.{stage}.{g['domain']}.after_recovery": g["after_recovery"]
                                          for g in fired})
    return fired


class GateFailed(RuntimeError):
    pass


def _artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower())


@task(name="finish", cache_policy=NO_CACHE)
def finish_task(recipe: Recipe, run_id: str, status: str) -> RunReport:
    store, report = open_report(recipe, run_id)
    domains, rows = report.forgetting_matrix()
    if rows:
        table = [{"after_stage": stage, **{d: s for d, s in zip(domains, scores)}} for stage, scores in rows]
        ui_artifacts.create_table_artifact(table, key=_artifact_key(run_id, "forgetting-matrix"),
                                           description=f"Held-out score per domain after each stage of {run_id}")
    if recipe.tracking.enabled:
        tracker = Tracker(recipe, run_id)
        tracker.log_report(report)
        tracker.finish(status)
    return report
