"""The micro cascade's difficulty stage under the flow: report.json metrics, the histogram in the store and in
MLflow, and the GRPO stage that trains on the kept prompts."""

import json

import pytest
from mlflow.tracking import MlflowClient

import cascade.stages.kinds.grpo.run_grpo
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from tests.conftest import micro_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

METRICS = {"prompts", "rollouts", "kept", "dropped_solved", "dropped_unsolved", "cache_hits", "seconds"}


def test_difficulty_stage_reports_metrics_and_histogram(tmp_path, monkeypatch):
    recipe = micro_recipe(tmp_path, "eval.enabled=false", "stages.math_rl.steps=1")
    pools = {}
    real_load = cascade.stages.kinds.grpo.run_grpo.load_kept_prompts
    monkeypatch.setattr(
        cascade.stages.kinds.grpo.run_grpo,
        "load_kept_prompts",
        lambda ctx, ref, domains: pools.setdefault(ref.stage, real_load(ctx, ref, domains)),
    )
    cascade_flow(recipe, "dflt")
    store = Store.from_config(recipe.storage)
    report = json.loads(store.read_bytes("runs/dflt/report.json"))
    entry = next(s for s in report["stages"] if s["name"] == "difficulty")
    metrics = entry["metrics"]
    assert entry["status"] == "completed" and METRICS <= set(metrics)
    assert metrics["prompts"] == 8 and metrics["rollouts"] == 8 * 8 and metrics["cache_hits"] == 0
    assert metrics["kept"] + metrics["dropped_solved"] + metrics["dropped_unsolved"] == 8

    png = entry["plots"]["pass_rates"]
    assert png == f"{entry['checkpoint']}/pass_rates.png"
    assert store.read_bytes(png.split(f"{store.root}/", 1)[1]).startswith(b"\x89PNG")

    # if_rl drew its prompts from exactly the kept set
    assert list(pools) == ["difficulty"] and len(pools["difficulty"]) == metrics["kept"]

    client = MlflowClient(recipe.tracking.resolved_uri())
    run = client.search_runs(
        [client.get_experiment_by_name("cascade").experiment_id],
        "tags.`cascade.run_id` = 'dflt' and tags.`cascade.stage` = 'difficulty'",
    )[0]
    assert [a.path for a in client.list_artifacts(run.info.run_id, "plots")] == ["plots/pass_rates.png"]
    assert run.data.metrics["summary/kept"] == metrics["kept"]
