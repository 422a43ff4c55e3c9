"""Thin Prefect tasks around the stages: skip what is committed, track, record. No ML logic here.

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
import re
import time
from collections.abc import Iterator
from typing import Any

from prefect import artifacts as ui_artifacts
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.sync import concurrency
from prefect.runtime import flow_run

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointRef, adoptable
from cascade.artifacts.config import config_hash
from cascade.artifacts.html_report import write_run_report
from cascade.artifacts.lease import hold_run
from cascade.artifacts.report import RunReport
from cascade.artifacts.steplog import StepLog
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker, redact, register_stage, tracking_on
from cascade.stages.config_base import StageConfig
from cascade.stages.context import ListSink, StageContext, TeeSink, stage_workdir
from cascade.stages.errors import GateFailed
from cascade.stages.evaluate import stored_or_evaluated
from cascade.stages.gate import best_stages, decide
from cascade.stages.kinds import StageInputs, gain_targets, kind_of
from cascade.stages.launch import run_stage_where_configured
from cascade.stages.recipe import Recipe, validate_recipe
from cascade.tasks.progress import progress_for, stage_progress

COMPUTE_LIMIT_ENV = "CASCADE_COMPUTE_LIMIT"
# Set while the Prefect API is a server that the CLI command started and stops with itself: a link to its UI
# would be dead once the command ends, so the run's report gets none.
EPHEMERAL_API_ENV = "CASCADE_PREFECT_API_EPHEMERAL"
NO_COMPUTE_LIMIT = "none"  # stages take no slot: `cascade run`'s own server, one run in one process


def compute_limit_name() -> str:
    """The global concurrency limit training stages take a slot of: `compute`, or e.g. `gpu` on GPU clusters."""
    return os.environ.get(COMPUTE_LIMIT_ENV) or "compute"


def open_report(recipe: Recipe, run_id: str) -> tuple[Store, RunReport]:
    store = Store.from_config(recipe.storage)
    return store, RunReport.load(store, run_id) or RunReport(run_id=run_id, recipe=recipe.name)


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
    key = _artifact_key(run_id, f"{parameters['index']:02d}-{cfg.name}-{digest}")
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
    done, problems = adoptable(store, key)
    if done is not None and done.config_hash == config_hash(cfg):
        entry = next((s for s in report.stages if s["name"] == cfg.name), {})
        report.record_stage({**entry, **_kind_facts(cfg), "status": "skipped", "checkpoint": done.uri})
        report.save(store)
        return done
    rebuilt = f"its checkpoint did not verify: {'; '.join(problems)}" if problems else None
    if rebuilt:
        get_run_logger().warning(f"stage {cfg.name}: {rebuilt}; rebuilding it from its last valid step checkpoint")
    tracker = Tracker(recipe, run_id) if tracking_on(recipe.tracking) else None
    sink = tracker.stage_sink(cfg.name) if tracker else ListSink()
    steps = StepLog(store, run_id, index, cfg.name)  # the report's curves; exact under resume (restore)
    progress = stage_progress(f"{index:02d} {cfg.kind}:{cfg.name}", run_id, cfg.name)
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
        {
            **_kind_facts(cfg),
            "status": status,
            "checkpoint": uri,
            "seconds": round(seconds, 1),
            "metrics": metrics,
            **({"plots": plots} if plots else {}),
            **({"rebuilt": rebuilt} if rebuilt else {}),
            **({"peak_rss_mb": round(peak_rss_mb, 1)} if peak_rss_mb else {}),
        }
    )
    report.save(store)


def _kind_facts(cfg: StageConfig) -> dict[str, Any]:
    """What a stage's record says of it beside its outcome: its name, its kind, and its kind's report card (the
    page draws it from the record, knowing no kind)."""
    card = kind_of(cfg.kind).report_card
    return {"name": cfg.name, "kind": cfg.kind, **({"card": card.model_dump(mode="json")} if card else {})}


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


@task(name="evaluate", cache_policy=NO_CACHE)
def eval_task(recipe: Recipe, run_id: str, stage: str, index: int, model: CheckpointRef | None) -> dict[str, float]:
    """Scores of every domain after a stage; reused from the store when already computed."""
    store, report = open_report(recipe, run_id)
    key = layout.eval_key(run_id, index, stage)
    record, new = stored_or_evaluated(recipe, store, key, model, lambda part: progress_for(f"eval {stage}: {part}"))
    scores = record.scores
    if new and tracking_on(recipe.tracking):
        tracker = Tracker(recipe, run_id)
        tracker.log_scores(len(report.evals), scores)
        tracker.log_eval(stage, index, scores, record.items)
    report.record_eval(stage, scores)
    report.save(store)
    if tracking_on(recipe.tracking) and model is not None:
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
    tolerances = recipe.tolerances()
    decisions = decide(stage, earlier, scores, tolerances, policy)
    report.gate = [g for g in report.gate if g["stage"] != stage] + decisions
    report.save(store)
    if decisions:
        ui_artifacts.create_table_artifact(
            decisions, key=_artifact_key(run_id, "gate"), description=f"Regression gate after stage {stage}"
        )
        if tracking_on(recipe.tracking):
            Tracker(recipe, run_id).set_tags({f"gate.{stage}.{d['domain']}": d["action"] for d in decisions})
    if decisions and policy == "fail":
        worst = max(decisions, key=lambda d: d["drop"])
        raise GateFailed(
            f"regression gate: {worst['domain']} dropped {worst['drop']:.3f} after {stage} "
            f"(tolerance {worst['tolerance']})"
        )
    return decisions


@task(name="choose-teachers", cache_policy=NO_CACHE)
def choose_teachers_task(recipe: Recipe, run_id: str, cfg: StageConfig, through: str | None) -> StageConfig:
    """A stage that takes teachers (`teachers: auto`, or the gate's recovery) with its teachers chosen: per domain
    (cfg.domains, default every recipe domain), the stage whose checkpoint holds that domain's best dev score
    in the evals up to the one after `through`."""
    _, report = open_report(recipe, run_id)
    evals = report.evals_through(through) if through else []
    teachers = best_stages(evals, cfg.domains or list(recipe.domains))
    if not teachers:
        raise ValueError(f"stage {cfg.name!r}: teachers: auto, but no domain has been evaluated before it")
    return cfg.model_copy(update={"teachers": teachers})


@task(name="record-recovery", cache_policy=NO_CACHE)
def record_recovery_task(recipe: Recipe, run_id: str, stage: str, scores: dict[str, float]) -> list[dict[str, Any]]:
    store, report = open_report(recipe, run_id)
    for decision in report.gate:
        if decision["stage"] == stage:
            decision["after_recovery"] = scores[decision.get("column", decision["domain"])]
    report.save(store)
    fired = [g for g in report.gate if g["stage"] == stage]
    ui_artifacts.create_table_artifact(
        fired,
        key=_artifact_key(run_id, "gate"),
        description=f"Regression gate after {stage}, with the recovery's scores",
    )
    if tracking_on(recipe.tracking):
        Tracker(recipe, run_id).set_tags(
            {f"gate.{stage}.{g['domain']}.after_recovery": g["after_recovery"] for g in fired}
        )
    return fired


def _artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower())


@task(name="links", cache_policy=NO_CACHE)
def links_task(recipe: Recipe, run_id: str) -> str:
    """A markdown artifact on the flow run: the MLflow run and the store locations of this run."""
    store = Store.from_config(recipe.storage)
    lines = [f"# {recipe.name}: run `{run_id}`", "", "| what | where |", "| --- | --- |"]
    links = {}
    if tracking_on(recipe.tracking):
        links["mlflow"] = Tracker(recipe, run_id).run_url()
        lines.append(f"| MLflow run | {links['mlflow']} |")
    if flow_run.ui_url and not os.environ.get(EPHEMERAL_API_ENV):
        links["prefect"] = flow_run.ui_url
    if links:  # the HTML report links them
        _, report = open_report(recipe, run_id)
        report.links.update(links)
        report.save(store)
    for what, key in (
        ("run directory", layout.run_dir(run_id)),
        ("recipe", layout.recipe_key(run_id)),
        ("report", layout.report_key(run_id)),
        ("HTML report", layout.html_report_key(run_id)),
        ("evals", layout.evals_dir(run_id)),
    ):
        lines.append(f"| {what} | `{store.uri(key)}` |")
    lines += ["", f"Resume from the terminal: `cascade resume {run_id} --store {store.uri('')}`"]
    text = "\n".join(lines)
    ui_artifacts.create_markdown_artifact(
        text, key=_artifact_key(run_id, "links"), description=f"MLflow run and store URIs of {run_id}"
    )
    return text


@contextlib.contextmanager
def running(recipe: Recipe, run_id: str) -> Iterator[Recipe]:
    """A run's whole length, for every flow that writes one: its lease (re-entrant: the CLI may hold it
    already), its recipe (the stored one when the run has one, else this one, stored now under the lease),
    and, when the block raises, a FAILED finish of the report and the MLflow run."""
    store = Store.from_config(recipe.storage)
    tracking_on(recipe.tracking)  # a tracking server that does not answer fails here, before anything is written
    with hold_run(store, run_id):
        recipe = adopt_recipe(store, run_id, recipe)
        earlier = RunReport.load(store, run_id)
        if earlier is not None and (earlier.status or earlier.stopped):  # a resumed run is running again
            earlier.status = earlier.stopped = None
            earlier.save(store)
        try:
            yield recipe
        except BaseException as e:
            reason = (str(e).splitlines() or [""])[0][:300]
            finish_task(
                recipe, run_id, "FAILED", f"{type(e).__name__}: {redact(reason)}" if reason else type(e).__name__
            )
            raise


def adopt_recipe(store: Store, run_id: str, recipe: Recipe) -> Recipe:
    """The run's stored recipe when it has one (a resume, or a Retry of the flow run), else `recipe` with its
    `compute.dtype: auto` decided for this host, stored."""
    key = layout.recipe_key(run_id)
    if not store.exists(key):
        from cascade.stages.precision import pin_run_dtype  # torch: only once a run starts

        recipe = pin_run_dtype(recipe)
        store.write_bytes(key, recipe.model_dump_json(indent=1).encode())
        return recipe
    stored = validate_recipe(json.loads(store.read_bytes(key)), source=store.uri(key), stored=True)
    if stored.storage != recipe.storage:  # the store moved since the run began: it continues where it was found
        stored = stored.model_copy(update={"storage": recipe.storage})
    if stored != recipe:
        get_run_logger().info(f"continuing run {run_id} with its stored recipe {store.uri(key)}")
    return stored


@task(name="finish", cache_policy=NO_CACHE)
def finish_task(recipe: Recipe, run_id: str, status: str, stopped: str | None = None) -> RunReport:
    """The end of a run, finished or failed: the forgetting-matrix table, the HTML report of what exists (in the
    store, in MLflow, linked from a markdown artifact), and the MLflow run's final status."""
    store, report = open_report(recipe, run_id)
    report.status, report.stopped = status, stopped
    report.save(store)
    tracker = Tracker(recipe, run_id) if tracking_on(recipe.tracking) else None
    _report_page(recipe, run_id, store, tracker)
    domains, rows = report.forgetting_matrix()
    if rows:
        table = [{"after_stage": stage, **{d: s for d, s in zip(domains, scores)}} for stage, scores in rows]
        ui_artifacts.create_table_artifact(
            table,
            key=_artifact_key(run_id, "forgetting-matrix"),
            description=f"Held-out score per domain after each stage of {run_id}",
        )
    if tracker:
        tracker.log_report(report)
        tracker.finish(status)
    return report


def _report_page(recipe: Recipe, run_id: str, store: Store, tracker: Tracker | None) -> None:
    """report.html beside report.json, its plots and itself in MLflow, a markdown artifact linking both. A report
    that cannot be drawn is a warning: it must never fail (or hide the failure of) the run."""
    logger = get_run_logger()
    try:
        rendered = write_run_report(store, run_id, [s.name for s in recipe.stages], gain_targets(recipe.stages))
    except Exception as e:
        logger.warning(f"run report of {run_id} not written ({type(e).__name__}: {e})")
        return
    uri = store.uri(layout.html_report_key(run_id))
    lines = [
        f"# Run report of `{run_id}`",
        "",
        f"The forgetting heatmap, training curves, data, gate timeline, cost and links in one page: "
        f"[report.html]({uri})",
        "",
        f"- in the store: `{uri}`",
    ]
    if tracker:
        try:
            tracker.log_html_report(rendered.html, rendered.images)
            lines.append(f"- in MLflow: artifact `report.html` (plots under `plots/`) of the run {tracker.run_url()}")
        except Exception as e:
            logger.warning(f"MLflow: run report of {run_id} not logged ({e})")
    lines.append(f"- from the terminal: `cascade report {run_id} --html report.html`")
    try:
        ui_artifacts.create_markdown_artifact(
            "\n".join(lines), key=_artifact_key(run_id, "report"), description=f"The run report of {run_id}"
        )
    except Exception as e:
        logger.warning(f"Prefect: report artifact of {run_id} not created ({e})")
