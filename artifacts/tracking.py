"""MLflow tracking: one parent run per cascade run, one nested run per stage, per-step metrics.

Metrics are buffered and sent as `log_batch` calls from a background thread (a `log_metric` costs ~50 ms here,
which would dominate a tiny stage). Runs are found again by tag, so a resumed cascade keeps logging into the
same parent run. Params are the flattened recipe with anything secret-looking removed; credentials never
reach MLflow because the recipe never holds them, and as a second line of defence every param, tag and
artifact text is passed through `redact`, which blanks the values of secret-looking environment variables.

The tracking URI is a local sqlite file by default; `tracking.uri: http://host:port` talks to an MLflow server
(credentials, if any, from MLFLOW_TRACKING_USERNAME/PASSWORD/TOKEN, read by MLflow itself). With a server
started with `--artifacts-destination s3://...`, artifacts are proxied through it, so this process needs no
S3 credentials for them.

Registry: `register_stage` makes a stage's model directory (in the cascade store) a version of the registered
model `cascade-<recipe>`, with the alias `stage-<name>`, and `best-<domain>` for each domain on which the stage
holds the best score so far. Re-registering the same checkpoint (a resumed run) reuses its version; each version
carries the tag `cascade.checkpoint` (the store URI), which `registered_checkpoint` reads back for an alias.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import shlex
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from cascade.artifacts.config import SettingError, TrackingConfig, cascade_home
from cascade.artifacts.store import Store
from cascade.artifacts.urls import USERINFO_AFTER_SCHEME

log = logging.getLogger("cascade.tracking")
RUN_TAG = "cascade.run_id"
STAGE_TAG = "cascade.stage"
CHECKPOINT_TAG = "cascade.checkpoint"  # on a model version: the store URI of the checkpoint it is
SECRET_KEY = re.compile(r"(secret|password|passwd|token|credential|api_?key|access_?key)", re.I)
URL_USERINFO = USERINFO_AFTER_SCHEME  # a password with a "/" included
FLUSH_EVERY = 50
LOCAL_UI = "http://127.0.0.1:5000/"  # where `mlflow ui` serves a local tracking store by default
# A tracking server's first answer (per process). MLflow's own client retries a dead server for minutes.
PROBE_TIMEOUT_S = 10
_ANSWERED: dict[str, bool] = {}  # tracking URI -> whether its server answered this process's check


class TrackingUnavailable(SettingError):
    """The tracking server did not answer the check at the start of a run, and tracking is required."""


def tracking_on(cfg: TrackingConfig) -> bool:
    """Whether to track: `cfg.enabled`, and its server answered this process's one check of it. A server that
    does not answer is TrackingUnavailable (one line); with `tracking.required: false` a warning, once, and
    the run goes on untracked."""
    if not cfg.enabled:
        return False
    uri = cfg.resolved_uri()
    if uri not in _ANSWERED:
        _ANSWERED[uri] = server_answers(uri)
        if not _ANSWERED[uri] and not cfg.required:
            log.warning(
                "MLflow tracking server %s did not answer within %d s; running without tracking "
                "(tracking.required: false)",
                uri,
                PROBE_TIMEOUT_S,
            )
    if not _ANSWERED[uri] and cfg.required:
        raise TrackingUnavailable(
            f"MLflow tracking server {uri} did not answer within {PROBE_TIMEOUT_S} s; start "
            "it, or set tracking.required=false to run without tracking"
        )
    return _ANSWERED[uri]


def server_answers(uri: str) -> bool:
    """True for a local tracking store (sqlite, a directory); for an http(s) server, whether it sends any HTTP
    answer, an error status included (auth, a proxy), to GET /health within PROBE_TIMEOUT_S."""
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError, http.client.HTTPException):  # refused, timed out, unresolvable, not HTTP
        return False
    return True


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) and "name" in v for v in value):
        out = {}
        for v in value:
            out.update(flatten(v, f"{prefix}{v['name']}."))
        return out
    return {prefix.rstrip("."): str(value)}


def scrub(params: dict[str, str]) -> dict[str, str]:
    """Drop secret-looking keys, strip user:password@ from URLs, blank secret values from the environment."""
    return {k: redact(URL_USERINFO.sub("", v)) for k, v in params.items() if not SECRET_KEY.search(k)}


# Environment variables that hold credentials without a secret-looking name.
SECRET_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "MLFLOW_TRACKING_USERNAME"}


def secret_values() -> list[str]:
    """Values of credential-like environment variables (longest first), at least 4 characters long."""
    found = {v for k, v in environment().items() if (SECRET_KEY.search(k) or k in SECRET_ENV) and len(v) >= 4}
    return sorted(found, key=len, reverse=True)


def environment() -> dict[str, str]:
    """A copy of os.environ. MLflow's threads set and delete variables while a run logs, and reading os.environ
    as it changes raises KeyError (a run died on '_MLFLOW_TELEMETRY_SESSION_ID'): copy again until a copy holds."""
    while True:
        try:
            return dict(os.environ)
        except (KeyError, RuntimeError):
            continue


def redact(text: str) -> str:
    """text with any credential value from the environment replaced by '***' and URL userinfo removed."""
    for value in secret_values():
        text = text.replace(value, "***")
    return URL_USERINFO.sub("", text)


class MLflowSink:
    """A MetricSink into one MLflow run, buffered; batches are sent by one background thread of this sink.

    Not MLflow's own asynchronous logging: ending a run (`set_terminated`) shuts MLflow's async queue down,
    which waits out its 1 s polling interval, a second per stage. Here the batches are synchronous calls in our
    own worker thread, so the training loop never waits on the tracking server, and MLflow's queue stays idle."""

    def __init__(self, client: Any, run_id: str, prefix: str = ""):
        self.client, self.run_id, self.prefix = client, run_id, prefix
        self.buffer: list[Any] = []  # mlflow.entities.Metric
        self.pending: list[Future] = []
        self._pool: ThreadPoolExecutor | None = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.buffer += [
            Metric(metric_name(self.prefix + k), float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and v == v
        ]
        if len(self.buffer) >= FLUSH_EVERY:
            self.flush()

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        """Nothing to replace on a resume (a MetricSink's `restore`): MLflow keeps each step's metrics as logged."""

    def flush(self) -> None:
        if self.buffer:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="mlflow-sink")
            self.pending.append(self._pool.submit(self.client.log_batch, self.run_id, metrics=self.buffer))
            self.buffer = []

    def close(self) -> None:
        """Send what is buffered and wait for every batch. A failed batch is logged, not raised: losing
        metrics must not fail a stage whose checkpoint is already committed."""
        self.flush()
        for op in self.pending:
            try:
                op.result()
            except Exception as e:
                log.warning("MLflow run %s: a metrics batch was not logged (%s)", self.run_id, redact(str(e))[:300])
        self.pending = []
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def open_experiment(cfg: TrackingConfig) -> tuple[Any, str]:
    """(client, experiment id), creating the sqlite db and the experiment when missing. Two runs that start at
    once on a fresh machine would race in MLflow's schema migrations ("table ... already exists") and in creating
    the experiment: for a local db, a file lock beside it lets one process at a time open it."""
    uri = cfg.resolved_uri()
    if not uri.startswith("sqlite:///"):
        return _open_experiment(uri, cfg.experiment)
    from filelock import FileLock

    db = Path(uri[len("sqlite:///") :])
    db.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{db}.lock"):
        return _open_experiment(uri, cfg.experiment)


def _open_experiment(uri: str, experiment: str) -> tuple[Any, str]:
    # Imported here, not at module level: a run without tracking, and every other `cascade` command, need not
    # pay MLflow's ~3 s import.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    location = None
    if uri.startswith("sqlite:"):  # keep artifacts beside the db, not in cwd
        location = (cascade_home() / "mlartifacts").as_uri()
    if found is not None:
        if location is not None and found.artifact_location != location:
            follow_moved_home(Path(uri[len("sqlite:///") :]), found.artifact_location, location)
        return client, found.experiment_id
    return client, client.create_experiment(experiment, artifact_location=location)


def follow_moved_home(db: Path, old: str, new: str) -> None:
    """Point a home's MLflow db at its artifacts where the home now is. Experiments and runs hold absolute artifact
    locations, so after the home moved (the db and mlartifacts/ with it) MLflow would write a resumed run's
    artifacts at the old path, making the old home again. Only a db inside the current home whose recorded
    location is gone is rewritten."""
    import sqlite3

    gone = old.startswith("file://") and not Path(old.removeprefix("file://")).exists()
    if not (gone and db.resolve().is_relative_to(cascade_home().resolve())):
        return
    with sqlite3.connect(db) as con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE artifact_location = ?", (new, old))
        con.execute(
            "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) WHERE substr(artifact_uri, 1, ?) = ?",
            (new, len(old) + 1, len(old) + 1, f"{old}/"),
        )
    # MLflow keeps each run's artifact repository for the life of the process: a process that logged to a run
    # before the move (a served deploy) would still write to the old path
    from mlflow.tracking._tracking_service import utils as tracking_utils

    tracking_utils._artifact_repos_cache.clear()


class TrackedRecipe(Protocol):
    """What tracking reads of a recipe (artifacts/ never imports the recipe schema of stages/)."""

    name: str
    tracking: TrackingConfig

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


class Tracker:
    def __init__(self, recipe: TrackedRecipe, run_id: str):
        self.recipe, self.run_id = recipe, run_id
        self.client, self.experiment_id = open_experiment(recipe.tracking)
        self.parent_id = self._find_or_create(None, {RUN_TAG: run_id}, run_id)

    def _find_or_create(self, parent: str | None, tags: dict[str, str], name: str) -> str:
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        if parent:
            query += f" and tags.`mlflow.parentRunId` = '{parent}'"
        if parent:
            found = self.client.search_runs([self.experiment_id], query, max_results=1)
        else:  # the parent run: the stage runs carry the same run tag, so skip every run that has a parent
            found = [
                r
                for r in self.client.search_runs(
                    [self.experiment_id], query, max_results=1000, order_by=["attributes.start_time ASC"]
                )
                if "mlflow.parentRunId" not in r.data.tags
            ]
        if found:
            return found[0].info.run_id
        all_tags = dict(tags, **({"mlflow.parentRunId": parent} if parent else {}))
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        if parent is None:
            from mlflow.entities import Param

            params = scrub(flatten(self.recipe.model_dump(mode="json")))
            self.client.log_batch(run.info.run_id, params=[Param(k, v[:6000]) for k, v in params.items()])
        return run.info.run_id

    def stage_sink(self, stage: str) -> MLflowSink:
        run = self._find_or_create(self.parent_id, {RUN_TAG: self.run_id, STAGE_TAG: stage}, stage)
        self.client.update_run(run, status="RUNNING")
        return MLflowSink(self.client, run)

    def end_stage(self, sink: MLflowSink, summary: dict[str, Any], status: str) -> None:
        sink.log(0, {f"summary/{k}": v for k, v in summary.items() if isinstance(v, (int, float))})
        sink.close()
        self.client.set_terminated(sink.run_id, status=status)

    def log_checkpoint_files(self, sink: MLflowSink, store: Store, key: str, paths: list[str]) -> None:
        """Files of a stage checkpoint (its plots), copied from the store into the stage's run under plots/."""
        with tempfile.TemporaryDirectory() as tmp:
            for path in paths:
                local = Path(tmp) / Path(path).name
                store.get_file(f"{key}/{path}", local)
                self.client.log_artifact(sink.run_id, str(local), "plots")

    def log_scores(self, stage_index: int, scores: dict[str, float]) -> None:
        sink = MLflowSink(self.client, self.parent_id, prefix="eval/")
        sink.log(stage_index, scores)
        sink.close()

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.parent_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.parent_id, str(local_path), artifact_path)

    def log_text(self, text: str, artifact_file: str, run_id: str | None = None) -> None:
        """A text artifact (redacted) on the parent run, or on run_id."""
        self.client.log_text(run_id or self.parent_id, redact(text), artifact_file)

    def log_table(self, columns: dict[str, list[Any]], artifact_file: str) -> None:
        """A table artifact (MLflow's table JSON, shown as a table in the UI) on the parent run, replacing one
        logged before. Not MLflow's log_table: it appends to a table already there (a resumed run's matrix held
        each row twice), downloading it first with a progress bar on the terminal. String cells are redacted like
        every other text."""
        from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

        clean = {k: [redact(v) if isinstance(v, str) else v for v in col] for k, col in columns.items()}
        table = {"columns": list(clean), "data": [list(row) for row in zip(*clean.values())]}
        self.client.log_text(self.parent_id, json.dumps(table), artifact_file)
        logged = json.loads(self.client.get_run(self.parent_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
        entry = {"path": artifact_file, "type": "table"}
        if entry not in logged:
            self.client.set_tag(self.parent_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(logged + [entry]))

    def log_eval(self, stage: str, index: int, scores: dict[str, float], rows: list[dict[str, Any]]) -> None:
        """The eval after a stage, on the parent run: scores (evals/NN-stage.json) and one table row per item
        (evals/NN-stage-items.json; nested values as JSON text)."""
        self.log_text(json.dumps({"stage": stage, "scores": scores}, indent=1), f"evals/{index:02d}-{stage}.json")
        if rows:
            keys = sorted({k for r in rows for k in r})
            self.log_table({k: [_cell(r.get(k)) for r in rows] for k in keys}, f"evals/{index:02d}-{stage}-items.json")

    def log_report(self, report: Any) -> None:
        """report.json, the forgetting matrix (as a table) and gate decisions, on the parent run."""
        self.log_text(report.model_dump_json(indent=1), "report.json")
        domains, rows = report.forgetting_matrix()
        if rows:
            matrix = {"after_stage": [stage for stage, _ in rows]}
            matrix.update({d: [scores[i] for _, scores in rows] for i, d in enumerate(domains)})
            self.log_table(matrix, "forgetting_matrix.json")
        if report.gate:
            self.log_text(json.dumps([d.model_dump() for d in report.gate], indent=1), "gate.json")

    def log_html_report(self, html: str, images: dict[str, bytes]) -> None:
        """The rendered run report (report.html) and its plots (plots/<name>.png) on the parent run, so MLflow's UI
        shows the heatmap and the curves."""
        self.log_text(html, "report.html")
        with tempfile.TemporaryDirectory() as tmp:
            for name, png in images.items():
                local = Path(tmp) / name
                local.write_bytes(png)
                self.client.log_artifact(self.parent_id, str(local), "plots")

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.parent_id, status=status)

    def run_links(self) -> dict[str, str]:
        """Where a browser shows the run (the run record's links): `mlflow`, its page; for a local store,
        `mlflow_ui`, the command that serves that page."""
        base, serve = ui_of(self.recipe.tracking.resolved_uri())
        links = {"mlflow": f"{base}#/experiments/{self.experiment_id}/runs/{self.parent_id}"}
        return links if serve is None else {**links, "mlflow_ui": serve}

    def stage_run_id(self, stage: str) -> str | None:
        query = f"tags.`{RUN_TAG}` = '{self.run_id}' and tags.`{STAGE_TAG}` = '{stage}'"
        found = self.client.search_runs([self.experiment_id], query, max_results=1)
        return found[0].info.run_id if found else None


def ui_of(tracking_uri: str) -> tuple[str, str | None]:
    """(the base URL of the UI that shows a tracking store's runs, the command that serves it). A server shows its
    own (the command: None); a local store (sqlite, a directory) is no page a browser opens: `mlflow ui` serves it,
    by default at LOCAL_UI."""
    if tracking_uri.startswith(("http://", "https://")):
        return URL_USERINFO.sub("", tracking_uri), None
    return LOCAL_UI, f"mlflow ui --backend-store-uri {shlex.quote(tracking_uri)}"


def metric_name(key: str) -> str:
    """key as an MLflow metric name: MLflow takes letters, digits, '_', '-', '.', ' ', ':' and '/'; any other
    character (the '@' of a pass@k column) becomes '_'."""
    return re.sub(r"[^\w\-. :/]", "_", key)


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are, anything nested as JSON text."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value, default=str)
