"""The stage task: the stage-execution core (stages/execution.py: adopt what is done, else run the stage where its
compute says) under Prefect, with the compute slot, MLflow and the run report's record. No ML logic here.

Stage results are cached and persisted under the run (`runs/<run_id>/prefect-results` in the run's store), with
a cache key of run id + stage + stage config hash + input checkpoint digests: Prefect's Retry of a failed flow
run returns the completed stages as `Cached` and re-runs only from the failed one, which continues from its last
step checkpoint. A stage whose checkpoint is committed but whose result record is missing (a kill between the
two) is adopted by the core, as `cascade resume` always did; a cached result is handed on only where the core would
adopt the stage.

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
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger, task
from prefect.concurrency.sync import concurrency

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.config import config_hash
from cascade.artifacts.report import RunReport, StageRecord
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker, tracking_on
from cascade.stages.execution import StageHooks, StageOfRun, StageOutcome, Standing, execute_stage, standing
from cascade.stages.kinds import StageInputs, kind_of
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.train.context import ListSink, MetricSink
from cascade.tasks.lifecycle import artifact_key, write_report
from cascade.tasks.progress import stage_progress

COMPUTE_LIMIT_ENV = "CASCADE_COMPUTE_LIMIT"
NO_COMPUTE_LIMIT = "none"  # stages take no slot: `cascade run`'s own server, one run in one process


def compute_limit_name() -> str:
    """The global concurrency limit training stages take a slot of: `compute`, or e.g. `gpu` on GPU clusters."""
    return os.environ.get(COMPUTE_LIMIT_ENV) or "compute"


def stage_cache_key(_context: Any, parameters: dict[str, Any]) -> str:
    """store + run id + stage + stage config hash + the digests of every input checkpoint (policy, read stages,
    teachers).

    The store is part of the key: a cached result is a checkpoint URI, valid only where that store is."""
    cfg, inputs = parameters["cfg"], parameters["inputs"]
    recipe, run_id = parameters["recipe"], parameters["run_id"]
    digests = {
        "policy": inputs.policy.digest if inputs.policy else None,
        **{f"stage/{name}": ref.digest for name, ref in inputs.stages.items()},
        **{f"teacher/{domain}": ref.digest if ref else None for domain, ref in inputs.teachers.items()},
    }
    blob = json.dumps(
        {"store": recipe.storage.resolved_root(), "config": config_hash(cfg), "inputs": digests}, sort_keys=True
    )
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    key = artifact_key(run_id, f"{parameters['index']:02d}-{cfg.name}-{digest}")
    store = Store.from_config(recipe.storage)
    if standing(StageOfRun(recipe, store, run_id, parameters["index"], cfg), inputs).done is None:
        # A cached result may be handed on only where the stage would be adopted: forget it (its file is named by
        # the key), so Prefect runs the stage, which rebuilds it, instead of handing on a checkpoint that no
        # longer verifies.
        store.delete(f"{layout.results_key(run_id)}/{key}")
    return key


def compute_slot(kind: str) -> contextlib.AbstractContextManager:
    """One slot of the compute limit around a stage whose kind holds compute; data stages need none."""
    if not kind_of(kind).holds_compute or compute_limit_name() == NO_COMPUTE_LIMIT:
        return contextlib.nullcontext()
    return concurrency(compute_limit_name(), occupy=1)


@task(name="stage", cache_key_fn=stage_cache_key, persist_result=True)
def stage_task(
    recipe: Recipe, run_id: str, cfg: StageConfig, index: int, inputs: StageInputs, recovers: str | None = None
) -> CheckpointRef:
    """Run one stage: a recipe stage, or a gate's recovery stage at the index of the stage it `recovers`."""
    store = Store.from_config(recipe.storage)
    hooks = TaskHooks(recipe, store, run_id, cfg, index)
    started, memory = time.time(), PeakMemory()
    try:
        outcome = execute_stage(StageOfRun(recipe, store, run_id, index, cfg), inputs, hooks)
    except BaseException:
        _record(recipe, run_id, cfg, recovers, memory, status="failed", seconds=round(time.time() - started, 1))
        hooks.end(None)
        raise
    if outcome.adopted:
        write_report(recipe, run_id, lambda report: _record_skipped(report, cfg, recovers, outcome.checkpoint))
        return outcome.checkpoint
    uri = outcome.checkpoint.uri
    _record(
        recipe,
        run_id,
        cfg,
        recovers,
        memory,
        status="completed",
        checkpoint=uri,
        seconds=round(outcome.seconds, 1),
        metrics=outcome.metrics,
        plots={name: f"{uri}/{path}" for name, path in outcome.plots.items()},
        rebuilt=outcome.rebuilt,
    )
    hooks.end(outcome)
    return outcome.checkpoint


class TaskHooks(StageHooks):
    """What the flow adds around a stage that runs: MLflow's nested run of it (or a list), the CLI's bar and the
    Prefect progress artifact, the compute slot, and Prefect's run log."""

    def __init__(self, recipe: Recipe, store: Store, run_id: str, cfg: StageConfig, index: int):
        self.recipe, self.store, self.run_id, self.cfg, self.index = recipe, store, run_id, cfg, index
        self.tracker: Tracker | None = None
        self.metrics: MetricSink = ListSink()

    def sink(self) -> MetricSink:
        if tracking_on(self.recipe.tracking):
            self.tracker = Tracker(self.recipe, self.run_id)
            self.metrics = self.tracker.stage_sink(self.cfg.name)
        return self.metrics

    def progress(self) -> Callable[[int, int], None]:
        label = f"{self.index:02d} {self.cfg.kind}:{self.cfg.name}"
        return stage_progress(label, kind_of(self.cfg.kind).progress_unit, self.run_id, self.cfg.name)

    def hold(self) -> contextlib.AbstractContextManager:
        return compute_slot(self.cfg.kind)

    def starts(self, found: Standing) -> None:
        if found.rebuilt:
            get_run_logger().warning(f"stage {self.cfg.name}: {found.rebuilt}; rebuilding it")

    def notice(self, text: str) -> None:
        get_run_logger().warning(text)

    def end(self, outcome: StageOutcome | None) -> None:
        """MLflow's run of a stage that ran: its plots and FINISHED, or FAILED (None)."""
        if self.tracker is None:
            return
        if outcome is None:
            self.tracker.end_stage(self.metrics, {}, "FAILED")
            return
        try:
            plots = list(outcome.plots.values())
            self.tracker.log_checkpoint_files(self.metrics, self.store, outcome.checkpoint.key, plots)
        except Exception as e:  # the checkpoint is committed; a lost plot must not fail the stage
            get_run_logger().warning(f"MLflow: plots of {self.cfg.name} not logged ({e})")
        self.tracker.end_stage(self.metrics, outcome.metrics, "FINISHED")


def _record(
    recipe: Recipe, run_id: str, cfg: StageConfig, recovers: str | None, memory: PeakMemory, **outcome: Any
) -> None:
    """The stage's row of the report: its kind's facts, `outcome` (StageRecord's fields: status, checkpoint, seconds,
    metrics, plots, rebuilt) and the process's peak resident memory while the stage ran."""
    peak = memory.peak_mb()
    row = StageRecord(**_kind_facts(cfg, recovers), **outcome, peak_rss_mb=round(peak, 1) if peak else None)
    write_report(recipe, run_id, lambda report: report.record_stage(row))


def _record_skipped(report: RunReport, cfg: StageConfig, recovers: str | None, checkpoint: CheckpointRef) -> None:
    """An adopted stage's row: skipped, with the figures of the run that made its checkpoint."""
    skipped = {**_kind_facts(cfg, recovers), "status": "skipped", "checkpoint": checkpoint.uri}
    earlier = report.stage(cfg.name)
    report.record_stage(earlier.model_copy(update=skipped) if earlier else StageRecord(**skipped))


def _kind_facts(cfg: StageConfig, recovers: str | None) -> dict[str, Any]:
    """What a stage's record says of it beside its outcome: its name, its kind, its kind's report card (the page
    draws it from the record, knowing no kind), and for a gate's recovery the stage it recovers."""
    return {"name": cfg.name, "kind": cfg.kind, "card": kind_of(cfg.kind).report_card, "recovers": recovers}


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
