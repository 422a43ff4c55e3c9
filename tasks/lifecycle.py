"""A run's lifecycle as Prefect tasks: its lease and recipe while it runs (`running`), the links artifact, and its
finish (the report's status, the HTML report, the forgetting matrix, MLflow's final status). The run's record,
report.json, is a projection of what the run's tasks report (a stage's row, an eval's scores, the gate's
decisions, a recovery's scores, links, the finish), and `write_report` is its one writer: each task hands it the
outcome it has, and none reads scores back from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator

from prefect import artifacts as ui_artifacts
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from cascade.artifacts import layout
from cascade.artifacts.html_report import write_run_report
from cascade.artifacts.lease import hold_run
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker, redact, tracking_on
from cascade.stages.kinds import gain_targets
from cascade.stages.recipe.schema import Recipe, validate_recipe

# Set while the Prefect API is a server that the CLI command started and stops with itself: a link to its UI
# would be dead once the command ends, so the run's report gets none.
EPHEMERAL_API_ENV = "CASCADE_PREFECT_API_EPHEMERAL"


def write_report(recipe: Recipe, run_id: str, change: Callable[[RunReport], object]) -> RunReport:
    """The run's stored record (a new one before its first write) with `change` applied, saved at once, so a run
    cut off anywhere keeps an accurate record of what finished; returns it."""
    store = Store.from_config(recipe.storage)
    report = RunReport.load(store, run_id) or RunReport(run_id=run_id, recipe=recipe.name)
    change(report)
    report.save(store)
    return report


def artifact_key(run_id: str, what: str) -> str:
    """Prefect artifact keys allow only lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{run_id}-{what}".lower())


@task(name="links", cache_policy=NO_CACHE)
def links_task(recipe: Recipe, run_id: str) -> str:
    """A markdown artifact on the flow run: the MLflow run and the store locations of this run."""
    store = Store.from_config(recipe.storage)
    lines = [f"# {recipe.name}: run `{run_id}`", "", "| what | where |", "| --- | --- |"]
    links = {}
    if tracking_on(recipe.tracking):
        links.update(Tracker(recipe, run_id).run_links())
        lines.append(f"| MLflow run | {mlflow_page(links)} |")
    if flow_run.ui_url and not os.environ.get(EPHEMERAL_API_ENV):
        links["prefect"] = flow_run.ui_url
    if links:  # the HTML report links them
        write_report(recipe, run_id, lambda report: report.links.update(links))
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
        text, key=artifact_key(run_id, "links"), description=f"MLflow run and store URIs of {run_id}"
    )
    return text


def mlflow_page(links: dict[str, str]) -> str:
    """The MLflow run's page (`Tracker.run_links`) in markdown: a link to a server's; for a local store, which no
    browser opens, the command that serves it, then the page."""
    if "mlflow_ui" in links:
        return f"`{links['mlflow_ui']}`, then open {links['mlflow']}"
    return f"[{links['mlflow']}]({links['mlflow']})"


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
            write_report(recipe, run_id, lambda report: report.record_finish(None))
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
        from cascade.stages.train.precision import pin_run_dtype  # torch: only once a run starts

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
    store = Store.from_config(recipe.storage)
    report = write_report(recipe, run_id, lambda report: report.record_finish(status, stopped))
    tracker = Tracker(recipe, run_id) if tracking_on(recipe.tracking) else None
    _report_page(recipe, run_id, store, tracker)
    domains, rows = report.forgetting_matrix()
    if rows:
        table = [{"after_stage": stage, **{d: s for d, s in zip(domains, scores)}} for stage, scores in rows]
        ui_artifacts.create_table_artifact(
            table,
            key=artifact_key(run_id, "forgetting-matrix"),
            description=f"Held-out score per domain after each stage of {run_id}",
        )
    if tracker:
        tracker.log_report(report)
        tracker.finish(status)
    return report


def _report_page(recipe: Recipe, run_id: str, store: Store, tracker: Tracker | None) -> None:
    """report.html beside the run's record, its plots and itself in MLflow, a markdown artifact linking both. A report
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
        "The forgetting heatmap, training curves, data, gate timeline, cost and links in one page, report.html:",
        "",
        f"- in the store: `{uri}`",
    ]
    if tracker:
        try:
            tracker.log_html_report(rendered.html, rendered.images)
            page = mlflow_page(tracker.run_links())
            lines.append(f"- in MLflow: artifact `report.html` (plots under `plots/`) of the run: {page}")
        except Exception as e:
            logger.warning(f"MLflow: run report of {run_id} not logged ({e})")
    lines.append(f"- from the terminal: `cascade report {run_id} --html report.html`")
    try:
        ui_artifacts.create_markdown_artifact(
            "\n".join(lines), key=artifact_key(run_id, "report"), description=f"The run report of {run_id}"
        )
    except Exception as e:
        logger.warning(f"Prefect: report artifact of {run_id} not created ({e})")
