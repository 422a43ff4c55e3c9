"""MLflow tracking: one parent run per cascade run, one nested run per stage, per-step metrics.

Metrics are buffered and sent with asynchronous `log_batch` (a synchronous `log_metric` costs ~50 ms here,
which would dominate a tiny stage). Runs are found again by tag, so a resumed cascade keeps logging into the
same parent run. Params are the flattened recipe with anything secret-looking removed; credentials never
reach MLflow because the recipe never holds them.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from stages.recipe import Recipe, cascade_home

RUN_TAG = "cascade.run_id"
STAGE_TAG = "cascade.stage"
SECRET_KEY = re.compile(r"(secret|password|passwd|token|credential|api_?key|access_?key)", re.I)
URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
FLUSH_EVERY = 50


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
    """Drop secret-looking keys and strip user:password@ from URLs."""
    return {k: URL_USERINFO.sub("", v) for k, v in params.items() if not SECRET_KEY.search(k)}


class MLflowSink:
    """A MetricSink into one MLflow run, buffered and asynchronous."""

    def __init__(self, client: MlflowClient, run_id: str, prefix: str = ""):
        self.client, self.run_id, self.prefix = client, run_id, prefix
        self.buffer: list[Metric] = []
        self.pending: list[Any] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.buffer += [Metric(self.prefix + k, float(v), now, step) for k, v in metrics.items()
                        if isinstance(v, (int, float)) and v == v]
        if len(self.buffer) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.pending.append(self.client.log_batch(self.run_id, metrics=self.buffer, synchronous=False))
            self.buffer = []

    def close(self) -> None:
        self.flush()
        for op in self.pending:
            if op is not None:
                op.wait()
        self.pending = []


class Tracker:
    def __init__(self, recipe: Recipe, run_id: str):
        self.recipe, self.run_id = recipe, run_id
        uri = recipe.tracking.resolved_uri()
        if uri.startswith("sqlite:///"):
            Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment()
        self.parent_id = self._find_or_create(None, {RUN_TAG: run_id}, run_id)

    def _experiment(self) -> str:
        name = self.recipe.tracking.experiment
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.recipe.tracking.resolved_uri().startswith("sqlite:"):  # keep artifacts beside the db, not in cwd
            location = (cascade_home() / "mlartifacts").as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def _find_or_create(self, parent: str | None, tags: dict[str, str], name: str) -> str:
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        if parent:
            query += f" and tags.`mlflow.parentRunId` = '{parent}'"
        found = self.client.search_runs([self.experiment_id], query, max_results=1)
        if found:
            return found[0].info.run_id
        all_tags = dict(tags, **({"mlflow.parentRunId": parent} if parent else {}))
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        if parent is None:
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

    def log_scores(self, stage_index: int, scores: dict[str, float]) -> None:
        sink = MLflowSink(self.client, self.parent_id, prefix="eval/")
        sink.log(stage_index, scores)
        sink.close()

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.parent_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifact(self, local_path: str | Path) -> None:
        self.client.log_artifact(self.parent_id, str(local_path))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.parent_id, status=status)

    def run_url(self) -> str:
        return f"{self.recipe.tracking.resolved_uri()}#/experiments/{self.experiment_id}/runs/{self.parent_id}"
