"""The stage task: skip what is committed, run the stage where its compute says, track, record. No ML logic here.

Stage results are cached and persisted under the run (`runs/<run_id>/prefect-results` in the run's store), with
a cache key of run id + stage + stage config hash + input checkpoint digests: Prefect's Retry of a failed flow
run returns the completed stages as `Cached` and re-runs only from the failed one, which continues from its last
step checkpoint. A stage whose checkpoint is committed but whose result record is missing (a kill between the
two) is skipped by its manifest, as `cascade resume` always did.

Training stages hold one slot of a global concurrency limit (`$CASCADE_COMPUTE_LIMIT`, default `compute`), so
two training stages never share the machine. `cascade deploy` creates it with one slot. `cascade run` on its own
embedded server sets it to `none`: one run's stages are sequential, and a limit there would be shared, through
PREFECT_HOME's database, with every other `cascade run` on the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.concurrency.sync import concurrency

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointRef, adoptable
from cascade.artifacts.config import config_hash
from cascade.artifacts.report import RunReport, StageRecord
from cascade.artifacts.steplog import StepLog
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker, tracking_on
from cascade.stages.kinds import StageInputs, kind_of
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.walk import recovered
from cascade.stages.scale.launch import run_stage_where_configured
from cascade.stages.train.context import ListSink, StageContext, TeeSink, stage_workdir
from cascade.tasks.lifecycle import artifact_key, open_report
from cascade.tasks.progress import stage_progress

COMPUTE_LIMIT_ENV = "CASCADE_COMPUTE_LIMIT"
NO_COMPUTE_LIMIT = "none"  # stages take no slot: `cascade run`'s own server, one run in one process


def compute_limit_name() -> str:
    """The global concurrency limit training stages take a slot of: `compute`, or e.g. `gpu` on GPU clusters."""
    return os.environ.get(COMPUTE_LIMIT_ENV) or "compute"


def stage_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    """store + run id + stage + stage config hash + the digests of every input checkpoint (policy, read stages).

    The store is part of the key: a cached result is a checkpoint URI, valid only where that store is."""
    cfg, inputs = parameters["cfg"], parameters["inputs"]
    recipe, run_id = parameters["recipe"], parameters["run_id"]
    digests = {
        "policy": inputs.policy.digest if inputs.policy else None,
        **{f"stage/{name}": ref.digest for name, ref in inputs.stages.items()},
    }
    blob = json.dumps(
        {"store": recipe.storage.resolved_root(), "config": config_hash(cfg), "inputs": digests}, sort_keys=True
    )
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    key = artifact_key(run_id, f"{parameters['index']:02d}-{cfg.name}-{digest}")
    store = Store.from_config(recipe.storage)
    if adoptable(store, layout.stage_key(run_id, parameters["index"], cfg.name))[1]:
        # The checkpoint this cached result names no longer verifies: forget the result (its file is named by
        # the key), so Prefect runs the stage, which rebuilds it, instead of handing the broken one on.
        store.delete(f"{layout.results_key(run_id)}/{key}")
    return key


def compute_slot(kind: str) -> contextlib.AbstractContextManager:
    """One slot of the compute limit around a stage whose kind holds compute; data stages need none."""
    if not kind_of(kind).holds_compute or compute_limit_name() == NO_COMPUTE_LIMIT:
        return contextlib.nullcontext()
    return concurrency(compute_limit_name(), occupy=1)


@task(name="stage", cache_key_fn=stage_cache_key, persist_result=True)
def stage_task(recipe: Recipe, run_id: str, cfg: StageConfig, index: int, inputs: StageInputs) -> CheckpointRef:
    """Run one stage (a recipe stage, or a gate's recovery stage at the index of the stage it recovers)."""
    store, report = open_report(recipe, run_id)
    key = layout.stage_key(run_id, index, cfg.name)
    done, problems = adoptable(store, key, config_hash(cfg))
    if done is not None:
        skipped = {**_kind_facts(cfg), "status": "skipped", "checkpoint": done.uri}
        earlier = report.stage(cfg.name)  # keeps the figures of the run that made the checkpoint
        report.record_stage(earlier.model_copy(update=skipped) if earlier else StageRecord(**skipped))
        report.save(store)
        return done
    rebuilt = f"its checkpoint did not verify: {'; '.join(problems)}" if problems else None
    if rebuilt:
        get_run_logger().warning(f"stage {cfg.name}: {rebuilt}; rebuilding it from its last valid step checkpoint")
    tracker = Tracker(recipe, run_id) if tracking_on(recipe.tracking) else None
    sink = tracker.stage_sink(cfg.name) if tracker else ListSink()
    steps = StepLog(store, run_id, index, cfg.name)  # the report's curves; exact under resume (restore)
    label = f"{index:02d} {cfg.kind}:{cfg.name}"
    progress = stage_progress(label, kind_of(cfg.kind).progress_unit, run_id, cfg.name)
    started = time.time()
    memory = PeakMemory()
    try:
        with compute_slot(cfg.kind), stage_workdir() as workdir:
            ctx = StageContext(recipe, store, run_id, key, TeeSink(sink, steps), progress=progress, workdir=workdir)
            result = run_stage_where_configured(cfg, ctx, inputs)  # in-process, or torchrun per `compute`
    except BaseException:
        _close_quietly(steps)
        _record(store, report, cfg, "failed", None, time.time() - started, {}, peak_rss_mb=memory.peak_mb())
        if tracker:
            tracker.end_stage(sink, {}, "FAILED")
        raise
    steps.close()
    plots = {name: f"{result.checkpoint.uri}/{path}" for name, path in result.plots.items()}
    _record(
        store,
        report,
        cfg,
        "completed",
        result.checkpoint.uri,
        time.time() - started,
        result.metrics,
        plots,
        rebuilt,
        peak_rss_mb=memory.peak_mb(),
    )
    if tracker:
        try:
            tracker.log_checkpoint_files(sink, store, result.checkpoint.key, list(result.plots.values()))
        except Exception as e:  # the checkpoint is committed; a lost plot must not fail the stage
            get_run_logger().warning(f"MLflow: plots of {cfg.name} not logged ({e})")
        tracker.end_stage(sink, result.metrics, "FINISHED")
    return result.checkpoint


def _record(
    store: Store,
    report: RunReport,
    cfg,
    status: str,
    uri: str | None,
    seconds: float,
    metrics: dict,
    plots: dict[str, str] | None = None,
    rebuilt: str | None = None,
    peak_rss_mb: float | None = None,
) -> None:
    """plots: name -> store URI of an image in the stage's checkpoint; rebuilt: why a committed one was redone;
    peak_rss_mb: the process's peak resident memory while the stage ran."""
    report.record_stage(
        StageRecord(
            **_kind_facts(cfg),
            status=status,
            checkpoint=uri,
            seconds=round(seconds, 1),
            metrics=metrics,
            plots=plots or {},
            rebuilt=rebuilt,
            peak_rss_mb=round(peak_rss_mb, 1) if peak_rss_mb else None,
        )
    )
    report.save(store)


def _kind_facts(cfg: StageConfig) -> dict[str, Any]:
    """What a stage's record says of it beside its outcome: its name, its kind, its kind's report card (the page
    draws it from the record, knowing no kind), and for a gate's recovery the stage it recovers."""
    return {"name": cfg.name, "kind": cfg.kind, "card": kind_of(cfg.kind).report_card, "recovers": recovered(cfg.name)}


def _close_quietly(steps: StepLog) -> None:
    try:
        steps.close()
    except Exception as e:  # the stage's own error is the one to raise
        get_run_logger().warning(f"step log {steps.key} not written ({e})")


class PeakMemory:
    """The process's peak resident memory from now on (Linux: VmHWM, reset through /proc/self/clear_refs);
    elsewhere the process's peak so far (ru_maxrss)."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def peak_mb(self) -> float | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        try:
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        except ImportError:
            return None
