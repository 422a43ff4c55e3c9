"""Tracking against a real `mlflow server` whose artifacts live on S3 (moto): metrics, eval/report artifacts
(proxied by the server, so this process needs no S3 access for them) and the model registry."""

import json

import pytest

from cascade.artifacts.model_registry import register_stage
from cascade.artifacts.store import Store
from cascade.artifacts.tracking import Tracker
from tests.faults.conftest import s3_recipe

pytestmark = pytest.mark.slow


def test_tracker_against_an_mlflow_server(s3, mlflow_url, tmp_path):
    from cascade.artifacts.report import RunReport

    recipe = s3_recipe(tmp_path, s3.url, "mlflow-art", f"tracking.uri={mlflow_url}")
    tracker = Tracker(recipe, "srv-1")
    assert Tracker(recipe, "srv-1").parent_id == tracker.parent_id  # a resumed run finds its parent run again
    sink = tracker.stage_sink("sft")
    for step in range(1, 121):
        sink.log(step, {"loss": 1.0 / step, "lr": 0.1})
    tracker.end_stage(sink, {"final_loss": 0.01}, "FINISHED")
    history = tracker.client.get_metric_history(sink.run_id, "loss")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == list(range(1, 121))

    report = RunReport(run_id="srv-1", recipe=recipe.name)
    report.record_eval("sft", {"math": 0.25})
    tracker.log_eval("sft", 1, {"math": 0.25}, [{"id": "q1", "score": 0.0}])
    tracker.log_report(report)
    tracker.log_html_report("<html>the run report</html>", {"forgetting_matrix.png": b"\x89PNG fake"})
    tracker.finish("FINISHED")
    names = {a.path for a in tracker.client.list_artifacts(tracker.parent_id)}
    assert {"report.json", "forgetting_matrix.json", "evals", "report.html", "plots"} <= names
    assert [a.path for a in tracker.client.list_artifacts(tracker.parent_id, "plots")] == [
        "plots/forgetting_matrix.png"
    ]
    assert Tracker(recipe, "srv-1").parent_id == tracker.parent_id  # not the stage run, which has the run tag too
    got = tracker.client.download_artifacts(tracker.parent_id, "report.json", str(tmp_path))
    assert json.loads(open(got).read())["run_id"] == "srv-1"
    objects = Store("s3://mlflow-art/mlartifacts", {"client_kwargs": {"endpoint_url": s3.url}}).list("")
    assert any(k.endswith("/report.json") for k in objects), objects  # the server put it in the S3 bucket

    version = register_stage(tracker, "sft", "s3://mlflow-art/cascade/runs/srv-1/01-sft", ["math"])
    by_alias = tracker.client.get_model_version_by_alias(f"cascade-{recipe.name}", "best-math")
    assert by_alias.version == version.version and by_alias.source.endswith("/01-sft/model")
    assert tracker.client.get_model_version_by_alias(f"cascade-{recipe.name}", "stage-sft").version == version.version
    page = f"{mlflow_url}#/experiments/{tracker.experiment_id}/runs/{tracker.parent_id}"
    assert tracker.run_links() == {"mlflow": page}  # a server shows its own runs: no command to serve them
