"""Expected outcomes of a served flow run are one line in the terminal that serves it, with no traceback.

`cascade deploy` serves its deployments with Prefect's runner, which runs each flow run as `python -m prefect.engine`
in a process of its own, the flow run's id in PREFECT__FLOW_RUN_ID, and its output in the serving terminal. Each test
here runs a flow run of a registered deployment the same way and reads that output: a run form naming a stage the
recipe does not have, and a regression eval that finds a regression. Both printed two full tracebacks (~45 lines).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cascade.infra.deploy import runner_deployments
from cascade.infra.deployments import DEPLOYMENTS

pytestmark = pytest.mark.slow


def served_run(prefect_api: str, home: Path, deployment: str, parameters: dict) -> tuple[str, dict]:
    """What the serving terminal shows of one flow run of `deployment` (its schedule left out), and the run."""
    from prefect.client.orchestration import get_client

    spec = dataclasses.replace(next(s for s in DEPLOYMENTS if s.name == deployment), cron=None)
    (registered,) = runner_deployments([spec])
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(registered.apply(), parameters=parameters)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "MLFLOW_", "PREFECT_"))}
    env.update(
        PREFECT_API_URL=prefect_api,
        PREFECT__FLOW_RUN_ID=str(run.id),
        PREFECT_LOGGING_LEVEL="INFO",  # what `cascade deploy` sets: the flow runs' log lines in its terminal
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        CASCADE_HOME=str(home),
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        [sys.executable, "-m", "prefect.engine"], env=env, capture_output=True, text=True, timeout=300
    )
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run.id).state
    return done.stdout + done.stderr, {"state": state.type.value, "message": state.message, "code": done.returncode}


def assert_one_line(said: str, message: str) -> None:
    assert "Traceback" not in said, said
    lines = [line for line in said.splitlines() if message in line]
    assert len(lines) == 1 and "Finished in state Failed(" in lines[0], said


def test_a_run_form_naming_no_stage_of_the_recipe_is_one_line(prefect_api, tmp_path):
    request = {"recipe": "micro", "stages": {"nope": {"steps": 1}}}
    said, run = served_run(prefect_api, tmp_path / "home", "cascade", {"request": request})
    message = "stages: no stage named ['nope']"
    assert_one_line(said, message)
    assert run["state"] == "FAILED" and message in run["message"] and run["code"] == 0


def test_a_regression_the_nightly_finds_is_one_line(prefect_api, tmp_path):
    """An untrained model against a baseline of 1.0 on math: the regression eval ends Failed, naming the drop."""
    from cascade.artifacts.checkpoint import write_checkpoint
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.evals.regression import Baseline, BaselineEntry, save_baseline
    from cascade.stages.train.model import initial_model

    raw = load_recipe(
        "micro",
        [
            f"storage.root=file://{tmp_path}/store",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            "domains.math.heldout_size=2",
            "domains.math.eval_temperature=0",
        ],
    ).model_dump(mode="json")
    raw |= {"domains": {"math": raw["domains"]["math"]}, "stages": [s for s in raw["stages"] if s["name"] == "math_rl"]}
    (tmp_path / "math.yaml").write_text(yaml.safe_dump(raw))
    recipe = load_recipe(str(tmp_path / "math.yaml"))
    store = Store.from_config(recipe.storage)
    model, tokenizer = initial_model(recipe.model, recipe.seed)
    model.save_pretrained(tmp_path / "untrained" / "model")
    tokenizer.save_pretrained(tmp_path / "untrained" / "model")
    write_checkpoint(
        store, "runs/r/00-untrained", tmp_path / "untrained", stage="untrained", step=None, parent=None, config_hash="-"
    )
    entry = BaselineEntry(score=1.0, checkpoint="best", uri=store.uri("runs/best"))
    save_baseline(store, Baseline(name="nightly", domains={"math": entry}))

    parameters = {"recipe": str(tmp_path / "math.yaml"), "checkpoints": ["runs/r/00-untrained"]}
    said, run = served_run(prefect_api, tmp_path / "home", "nightly", parameters)
    message = "1 regression(s) against baseline 'nightly': runs/r/00-untrained math 0.000 < 1.000 (drop 1.0)"
    assert_one_line(said, message)
    assert run["state"] == "FAILED" and message in run["message"] and run["code"] == 0


def test_the_gate_stopping_a_run_as_asked_drops_its_tracebacks_and_other_failures_keep_theirs():
    """`gate.policy: fail` ends the cascade's flow run with GateFailed, an outcome the recipe asked for: the records
    that carry it are dropped (its state line stays); an unexpected error keeps its traceback."""
    import logging

    from cascade.infra.flow_outcomes import ExpectedOutcomeTracebacks
    from cascade.stages.errors import GateFailed

    def record(error: BaseException) -> logging.LogRecord:
        return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "x", None, (type(error), error, None))

    keep = ExpectedOutcomeTracebacks().filter
    assert not keep(record(GateFailed("regression gate: math dropped 0.130 after if_rl (tolerance 0.05)")))
    assert keep(record(KeyError("created")))
