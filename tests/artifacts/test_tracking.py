"""Tracking: secrets never reach MLflow; stages register as model versions with stage and best-domain aliases."""

import json

import pytest

from cascade.artifacts.model_registry import register_stage
from cascade.artifacts.tracking import Tracker, redact, scrub
from tests.conftest import micro_recipe


def test_scrub_and_redact(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEKEYID")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "hunter22")
    params = {
        "tracking.uri": "http://bob:hunter22@mlflow:5000",
        "storage.api_key": "x",
        "note": "key AKIAFAKEKEYID and s3cr3t-value",
        "seed": "0",
    }
    assert scrub(params) == {"tracking.uri": "http://mlflow:5000", "note": "key *** and ***", "seed": "0"}
    assert redact("pw=hunter22") == "pw=***"


@pytest.fixture(scope="module")
def mlflow_db(tmp_path_factory):
    """One sqlite tracking db for the module: creating its schema takes seconds, once."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


@pytest.fixture
def tracker(tmp_path, mlflow_db, request):
    recipe = micro_recipe(tmp_path, f"tracking.uri={mlflow_db}", f"tracking.experiment={request.node.name[:40]}")
    return Tracker(recipe, "run-1")


def test_register_stage_versions_and_aliases(tracker):
    client = tracker.client
    tracker.stage_sink("sft").close()
    v1 = register_stage(tracker, "sft", "s3://bucket/runs/run-1/01-sft", ["math", "instruct"])
    assert v1.source == "s3://bucket/runs/run-1/01-sft/model" and v1.run_id == tracker.stage_run_id("sft")
    v2 = register_stage(tracker, "if_rl", "s3://bucket/runs/run-1/02-if_rl", ["instruct"])
    name = "cascade-micro"
    alias = {
        a: client.get_model_version_by_alias(name, a).version
        for a in ("stage-sft", "stage-if_rl", "best-math", "best-instruct")
    }
    assert alias == {
        "stage-sft": v1.version,
        "stage-if_rl": v2.version,
        "best-math": v1.version,
        "best-instruct": v2.version,
    }
    again = register_stage(tracker, "sft", "s3://bucket/runs/run-1/01-sft", ["math"])  # resumed run
    assert again.version == v1.version and len(client.search_model_versions(f"name = '{name}'")) == 2


def test_eval_and_report_artifacts_on_the_parent_run(tracker, tmp_path):
    from cascade.artifacts.report import RunReport

    report = RunReport(run_id="run-1", recipe="micro")
    report.record_eval("sft", {"math": 0.5, "instruct": 0.25})
    tracker.log_eval("sft", 1, {"math": 0.5}, [{"id": "a", "score": 1.0}])
    tracker.log_report(report)
    paths = {a.path for a in tracker.client.list_artifacts(tracker.parent_id)}
    assert {"report.json", "forgetting_matrix.json", "evals"} <= paths
    local = tracker.client.download_artifacts(tracker.parent_id, "forgetting_matrix.json", str(tmp_path))
    table = json.loads(open(local).read())  # MLflow's table format: columns + rows
    assert table["columns"] == ["after_stage", "instruct", "math"] and table["data"] == [["sft", 0.25, 0.5]]
    evals = {a.path for a in tracker.client.list_artifacts(tracker.parent_id, "evals")}
    assert evals == {"evals/01-sft.json", "evals/01-sft-items.json"}


def test_a_resumed_run_replaces_its_tables_without_downloading_them(tracker, tmp_path, capfd):
    """A resumed run logs its report again: the matrix in MLflow holds each row once, and nothing is downloaded
    (MLflow's own log_table appends to a table already there, which it downloads first, drawing `Downloading
    artifacts` progress bars on the terminal)."""
    from cascade.artifacts.report import RunReport

    report = RunReport(run_id="run-1", recipe="micro")
    report.record_eval("sft", {"math": 0.5})
    tracker.log_report(report)
    report.record_eval("if_rl", {"math": 0.75})
    capfd.readouterr()
    tracker.log_report(report)
    said = capfd.readouterr()
    assert "Downloading artifacts" not in said.err + said.out
    local = tracker.client.download_artifacts(tracker.parent_id, "forgetting_matrix.json", str(tmp_path))
    table = json.loads(open(local).read())
    assert table == {"columns": ["after_stage", "math"], "data": [["sft", 0.5], ["if_rl", 0.75]]}
    logged = json.loads(tracker.client.get_run(tracker.parent_id).data.tags["mlflow.loggedArtifacts"])
    assert logged == [{"path": "forgetting_matrix.json", "type": "table"}]  # MLflow's UI shows it as a table


def test_secrets_are_read_again_when_the_environment_changes_mid_read(monkeypatch):
    """MLflow's threads change os.environ while a run logs; a read that meets a vanished key reads again."""
    from collections.abc import Mapping
    from types import SimpleNamespace

    import cascade.artifacts.tracking as tracking

    class ChangingEnviron(Mapping):
        def __init__(self, data):
            self.data, self.reads = data, 0

        def __iter__(self):
            self.reads += 1
            if self.reads == 1:
                raise KeyError("_MLFLOW_TELEMETRY_SESSION_ID")
            return iter(self.data)

        def __getitem__(self, key):
            return self.data[key]

        def __len__(self):
            return len(self.data)

    changing = ChangingEnviron({"SERVICE_API_KEY": "s3cr3t-value", "HOME": "/root"})
    monkeypatch.setattr(tracking, "os", SimpleNamespace(environ=changing))  # the process's own stays intact
    assert tracking.secret_values() == ["s3cr3t-value"] and changing.reads == 2


OPEN_AT = """
import sys, time
from cascade.artifacts.config import TrackingConfig
from cascade.artifacts.tracking import open_experiment
import mlflow.tracking  # its import (seconds) before the common start, so that the processes open the db together
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
print(open_experiment(TrackingConfig(uri=sys.argv[2], experiment="e"))[1])
"""


def test_runs_that_start_together_on_a_fresh_machine_share_one_db_and_experiment(tmp_path):
    """Four processes open a local MLflow db that does not exist yet, at the same instant: each gets the one
    experiment. Without the lock (2026-11-27) two `cascade run`s started together failed in MLflow's schema
    migrations ("table evaluation_datasets already exists"), and so did this test (docs/LOG.md)."""
    import subprocess
    import sys
    import time

    start, uri = f"{time.time() + 10:.3f}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT, start, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), p.stdout.read().strip(), p.stderr.read()[-300:]) for p in procs]
    assert all(rc == 0 for rc, _, _ in results) and len({out for _, out, _ in results}) == 1, results


def test_a_score_column_becomes_a_metric_name_mlflow_takes():
    from mlflow.utils.validation import _validate_metric_name

    from cascade.artifacts.tracking import metric_name

    assert metric_name("eval/pass@8/math") == "eval/pass_8/math"
    assert metric_name("eval/greedy/math") == "eval/greedy/math"
    for name in ("eval/pass@8/math", "reward/tool", "a b:c-d.e"):
        _validate_metric_name(metric_name(name))  # raises on a name MLflow refuses


def test_a_moved_home_logs_a_resumed_runs_artifacts_where_it_is_now(tmp_path, monkeypatch):
    """The home (its MLflow db and artifacts) moves; the run resumes there: MLflow follows, and nothing is written
    at the old path."""
    import shutil

    old, new = tmp_path / "home", tmp_path / "moved"
    monkeypatch.setenv("CASCADE_HOME", str(old))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    recipe = micro_recipe(tmp_path / "recipe", "tracking.uri=null")  # the default: the home's db
    note = tmp_path / "note.txt"
    note.write_text("before the move")
    Tracker(recipe, "run-1").log_artifact(note)
    shutil.move(old, new)
    monkeypatch.setenv("CASCADE_HOME", str(new))
    tracker = Tracker(recipe, "run-1")
    note.write_text("after the move")
    tracker.log_artifact(note, "again")
    assert not old.exists()
    assert {a.path for a in tracker.client.list_artifacts(tracker.parent_id)} == {"note.txt", "again"}
    assert tracker.client.get_run(tracker.parent_id).info.artifact_uri.startswith((new / "mlartifacts").as_uri())
