"""What a run shows on its Prefect flow run, as the UI's Artifacts tab lists it: the gate's verdict after every
stage, and links a browser opens (a local MLflow store: the command that serves it, then the page)."""

from __future__ import annotations

import logging

import pytest

from cascade.artifacts.report import EvalScores, RunReport
from cascade.artifacts.store import Store
from cascade.tasks import evals, lifecycle
from tests.conftest import micro_recipe


class Artifacts:
    """Stands in for prefect.artifacts: records each artifact as (kind, key, description, data)."""

    def __init__(self):
        self.made: list[tuple[str, str, str, object]] = []

    def create_markdown_artifact(self, markdown, key, description):
        self.made.append(("markdown", key, description, markdown))

    def create_table_artifact(self, table, key, description):
        self.made.append(("table", key, description, table))


@pytest.fixture
def artifacts(monkeypatch):
    made = Artifacts()
    monkeypatch.setattr(evals, "ui_artifacts", made)
    monkeypatch.setattr(lifecycle, "ui_artifacts", made)
    return made


def test_the_gate_artifact_says_whether_it_passed_or_what_fired_each_time_it_is_evaluated(tmp_path, artifacts):
    recipe = micro_recipe(tmp_path, "tracking.enabled=false")
    store = Store.from_config(recipe.storage)
    scored = [
        EvalScores(after_stage=stage, scores={"math": math, "instruct": 0.5})
        for stage, math in (("sft", 0.5), ("if_rl", 0.5), ("math_rl", 0.25))
    ]
    for i, scores in enumerate(scored):  # the flow hands the gate each eval and those before it
        evals.gate_task.fn(recipe, "g", scores, scored[:i], "warn")
    assert [(d.stage, d.domain) for d in RunReport.load(store, "g").gate] == [("math_rl", "math")]
    assert [made[:3] for made in artifacts.made] == [
        ("markdown", "g-gate", "Regression gate after stage sft"),
        ("markdown", "g-gate", "Regression gate after stage if_rl"),
        ("table", "g-gate", "Regression gate after stage math_rl"),
    ]
    assert [made[3] for made in artifacts.made[:2]] == [
        "Regression gate after `sft`: passed, nothing to compare with (no eval before this stage)",
        "Regression gate after `if_rl`: passed, no gated domain fell more than its tolerance below its best score "
        "so far (after `sft`)",
    ]
    (fired,) = artifacts.made[2][3]
    assert (fired["domain"], fired["best"], fired["best_stage"], fired["now"], fired["drop"], fired["action"]) == (
        "math",
        0.5,
        "sft",
        0.25,
        0.25,
        "warn",
    )


def test_a_local_mlflow_store_is_named_by_the_command_that_serves_it_never_by_a_sqlite_link(
    tmp_path, artifacts, monkeypatch
):
    """The run record's links and the flow run's links and report artifacts: for the default sqlite store, the
    page `mlflow ui` serves and that command; the HTML report in the store as a path, not a link to a file:// URI
    that a browser refuses from an http page."""
    monkeypatch.setattr(lifecycle, "get_run_logger", lambda: logging.getLogger("test"))
    recipe = micro_recipe(tmp_path)
    store = Store.from_config(recipe.storage)
    links_md = lifecycle.links_task.fn(recipe, "l")
    tracker = lifecycle.Tracker(recipe, "l")
    page = f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{tracker.parent_id}"
    serve = f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db"
    assert RunReport.load(store, "l").links == {"mlflow": page, "mlflow_ui": serve}
    assert f"| MLflow run | `{serve}`, then open {page} |" in links_md.splitlines()
    assert "sqlite:" not in links_md.replace(f"`{serve}`", "")

    lifecycle.finish_task.fn(recipe, "l", "FINISHED")
    (report_md,) = [made[3] for made in artifacts.made if made[1] == "l-report"]
    html = store.uri("runs/l/report.html")
    assert report_md.splitlines() == [
        "# Run report of `l`",
        "",
        "The forgetting heatmap, training curves, data, gate timeline, cost and links in one page, report.html:",
        "",
        f"- in the store: `{html}`",
        f"- in MLflow: artifact `report.html` (plots under `plots/`) of the run: `{serve}`, then open {page}",
        "- from the terminal: `cascade report l --html report.html`",
    ]
