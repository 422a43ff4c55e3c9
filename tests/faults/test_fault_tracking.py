"""URL settings from the environment get what recipe URLs get: one holding a password is refused in one line, exit
code 2, before anything is written, so the password reaches no output, store, MLflow or Prefect database. And a
tracking server that does not answer fails the run in one line within 30 s, or, with `tracking.required=false`,
is one warning and the run goes on untracked.

Before: `MLFLOW_TRACKING_URI=http://u:PW@127.0.0.1:1 cascade run micro` printed PW 12 times in a 1,395-line
traceback and stored it 14 times in Prefect's database, after urllib3 had retried the dead server for minutes.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from tests.faults.conftest import refusing_endpoint, run_cli, silent_endpoint

PASSWORD = "pw-" + secrets.token_hex(8)
TRACKING_BUDGET_S = 30  # from the CLI's start: 11.4 s at load 2 (a server that never answers)


def holding(root: Path, needle: str) -> list[str]:
    """Every file under root (stores, sqlite databases, logs) whose bytes hold needle."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


@pytest.mark.parametrize(
    "variable, value, field",
    [
        ("MLFLOW_TRACKING_URI", f"http://u:{PASSWORD}@127.0.0.1:1", "MLFLOW_TRACKING_PASSWORD"),
        ("AWS_ENDPOINT_URL", f"http://u:{PASSWORD}@127.0.0.1:1", "AWS_ACCESS_KEY_ID"),
        ("CASCADE_STORE", f"s3://u:{PASSWORD}@b/x", "AWS_ACCESS_KEY_ID"),
        ("MLFLOW_TRACKING_URI", f"http://u:ab/{PASSWORD}@127.0.0.1:1", "MLFLOW_TRACKING_PASSWORD"),
    ],
    ids=["mlflow-uri", "aws-endpoint", "cascade-store", "mlflow-uri-slash"],
)  # not the values: the password is random per process
def test_a_password_in_an_environment_url_is_refused_and_appears_nowhere(tmp_path, variable, value, field):
    home = tmp_path / "home"
    store = ["storage.root=s3://b/x"] if variable == "AWS_ENDPOINT_URL" else []
    # no PREFECT_API_URL: a run would start its own Prefect server, with its database in the test's PREFECT_HOME
    result, _ = run_cli(
        ["run", "micro", *store], home, **{variable: value}, PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=""
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"cascade: error: {variable}: a URL holds credentials") and field in lines[0]
    assert PASSWORD not in result.stdout + result.stderr
    assert holding(tmp_path, PASSWORD) == []
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*"))


@pytest.mark.parametrize("server", [silent_endpoint, refusing_endpoint], ids=["never-answers", "refused"])
def test_a_tracking_server_that_does_not_answer_fails_the_run_in_one_line(tmp_path, server):
    home = tmp_path / "home"
    with server() as url:
        result, elapsed = run_cli(
            ["run", "micro"], home, MLFLOW_TRACKING_URI=url, PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_API_URL=""
        )
    lines = result.stderr.strip().splitlines()
    assert elapsed < TRACKING_BUDGET_S, f"{elapsed:.0f} s: {result.stderr[-2000:]}"
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"cascade: error: MLflow tracking server {url} did not answer"), lines[0]
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*"))
    print(f"{server.__name__}: {elapsed:.1f} s: {lines[0]}")


@pytest.mark.slow
def test_without_required_tracking_a_down_server_is_one_warning_and_the_run_goes_on(tmp_path, prefect_api):
    home = tmp_path / "home"
    with refusing_endpoint() as url:
        result, _ = run_cli(
            ["run", "micro", "tracking.required=false", "--run-id", "untracked"],
            home,
            MLFLOW_TRACKING_URI=url,
            PREFECT_API_URL=prefect_api,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count(f"MLflow tracking server {url} did not answer") == 1, result.stderr[-2000:]
    assert (home / "runs" / "untracked" / "report.json").is_file()
