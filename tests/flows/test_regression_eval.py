"""Scheduled regression evals against a real Prefect server: deployments, event, automation, recovery.

The checkpoints come from a real two-stage cascade on the toy letter domains of test_gate_recovery (GRPO on
vowels, then on consonants: the vowel score falls from 1.0 to 0.0). The micro recipe cannot serve here: every
micro checkpoint, and the initial model, scores 0.0 on both of its domains, so no checkpoint is worse than
another. Every score compared below is a real held-out eval.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

import cascade.stages.domains
from cascade.artifacts.checkpoint import read_manifest
from cascade.artifacts.records import EvalRecord
from cascade.artifacts.store import Store
from cascade.stages.evals.regression import (
    Baseline,
    BaselineEntry,
    NotRecovered,
    RegressionFound,
    compare,
    load_baseline,
    raise_to,
    regressions,
    verdict_lines,
)
from cascade.tasks.regression_tasks import shown_rows
from tests.artifacts.servers import BIN, Server, free_port
from tests.flows.test_gate_recovery import LETTERS, LetterDomain, toy_recipe

pytestmark = [pytest.mark.slow]
ALIAS = "models:/cascade-toy-regression@stage-consonant_rl"


# --- the pure comparison ---------------------------------------------------------------------------------------


BASELINE_AB = Baseline(
    name="b",
    domains={d: BaselineEntry(score=v, checkpoint="a", uri="file:///s/a") for d, v in (("math", 0.5), ("code", 0.3))},
)


def test_drop_tolerance_and_verdict_per_domain():
    baseline = Baseline(
        name="b",
        domains={
            "math": BaselineEntry(score=0.50, checkpoint="a", uri="file:///s/a"),
            "code": BaselineEntry(score=0.30, checkpoint="a", uri="file:///s/a"),
            "tool": BaselineEntry(score=0.40, checkpoint="a", uri="file:///s/a"),
        },
    )
    scores = {"math": 0.40, "code": 0.27, "tool": 0.55, "mcqa": 0.2}
    rows = compare("ckpt", scores, baseline, {"math": 0.05, "code": 0.05, "tool": 0.05, "mcqa": 0.05})
    table = {r["domain"]: (r["baseline"], r["drop"], r["verdict"]) for r in rows}
    assert table == {
        "math": (0.50, 0.10, "regressed"),
        "code": (0.30, 0.03, "ok"),
        "tool": (0.40, -0.15, "ok"),
        "mcqa": (None, None, "no baseline"),
    }
    assert [r["domain"] for r in regressions(rows)] == ["math"]
    # the tolerance is per domain: 0.03 below baseline regresses under a 0.02 tolerance
    assert compare("ckpt", {"code": 0.27}, baseline, {"code": 0.02})[0]["verdict"] == "regressed"
    # exactly at the tolerance is not a regression (the gate's rule: drop > tolerance)
    assert compare("ckpt", {"math": 0.45}, baseline, {"math": 0.05})[0]["verdict"] == "ok"


def test_verdicts_print_one_line_per_domain_and_name_what_was_not_recovered():
    rows = compare("ckpt", {"math": 0.40, "code": 0.29}, BASELINE_AB, {"math": 0.05, "code": 0.05})
    rows += compare("ckpt", {"mcqa": 0.2}, None, {"mcqa": 0.05})
    assert verdict_lines(rows) == [
        "ckpt code: 0.290 vs baseline 0.300, drop +0.010 (tolerance 0.05): ok",
        "ckpt math: 0.400 vs baseline 0.500, drop +0.100 (tolerance 0.05): regressed",
        "ckpt mcqa: 0.200 vs baseline none: no baseline",
    ]
    error = NotRecovered("nightly", rows)
    assert str(error) == "1 domain(s) not recovered against baseline 'nightly': ckpt math 0.400 < 0.500 (drop 0.1)"
    assert isinstance(error, RegressionFound) and pickle.loads(pickle.dumps(error)).rows == rows


def test_raising_a_baseline_only_moves_domains_up():
    old = Baseline(
        name="b",
        domains={
            "math": BaselineEntry(score=0.5, checkpoint="a", uri="u-a"),
            "code": BaselineEntry(score=0.3, checkpoint="a", uri="u-a"),
        },
    )
    new = raise_to(old, "b", EvalRecord(checkpoint="c", model="u-c", scores={"math": 0.4, "code": 0.6, "tool": 0.1}))
    assert {d: (e.score, e.uri) for d, e in new.domains.items()} == {
        "math": (0.5, "u-a"),
        "code": (0.6, "u-c"),
        "tool": (0.1, "u-c"),
    }


# --- a real server, a real cascade -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """`prefect server start` on a free port with its own PREFECT_HOME and sqlite db; this module's flows,
    events and deployments go to it. Stopped at the end."""
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home, port = tmp_path_factory.mktemp("prefect-home"), free_port()
    env = {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "0.5",
        # services this module does not exercise (the scheduler would fill the db with nightly runs)
        **{
            f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false"
            for s in ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "CANCELLATION_CLEANUP")
        },
    }
    server = Server(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        port,
        "/api/health",
        home / "server.log",
        env=env,
        timeout=120,
    )
    server.start()
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"{server.url}/api"}):
            # the process-wide events worker keeps the API URL it started with (an earlier module's server)
            EventsWorker.drain_all(timeout=10)
            yield f"{server.url}/api"
            EventsWorker.drain_all(timeout=10)
    finally:
        server.stop()


def api(base: str, method: str, path: str, body: dict | None = None):
    request = urllib.request.Request(
        f"{base}{path}",
        method=method,
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


def poll(fn, timeout: float = 20.0):
    """fn() until it returns something truthy; the server persists events and fires automations in batches."""
    deadline = time.time() + timeout
    while True:
        found = fn()
        if found or time.time() > deadline:
            return found
        time.sleep(0.5)


@pytest.fixture(scope="module")
def toy(prefect_api, tmp_path_factory):
    """A recipe file, its store, and a finished two-stage cascade `toy` (vowel_rl, then consonant_rl)."""
    from cascade.flows.cascade import cascade_flow

    tmp = tmp_path_factory.mktemp("toy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(tmp / "home"))
        patch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
        cascade.stages.domains.register_domain(LetterDomain("vowels", "aeiou"))
        cascade.stages.domains.register_domain(LetterDomain("consonants", LETTERS))
        recipe = toy_recipe(tmp, policy="warn")
        recipe = recipe.model_copy(update={"stages": recipe.stages[:2]})
        path = tmp / "toy.yaml"
        path.write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
        cascade_flow(recipe, "toy")
        yield {"path": str(path), "recipe": recipe, "store": Store.from_config(recipe.storage)}


@pytest.fixture(scope="module")
def deployed(prefect_api):
    """Both deployments registered (serve-free: `.apply()`), and the automation ensured twice."""
    from cascade.infra.automations import ensure_automations
    from cascade.infra.deploy import runner_deployments
    from cascade.infra.deployments import DEPLOYMENTS

    specs = {spec.name: spec for spec in DEPLOYMENTS}
    nightly, recover = runner_deployments([specs["nightly"], specs["recover"]])
    ids = {"regression-eval": nightly.apply(), "recover": recover.apply()}
    ensure_automations()
    ensure_automations()
    return ids


@pytest.fixture(scope="module")
def regression_run(toy, deployed, prefect_api):
    """Baseline `nightly` set (CLI) from the cascade's own eval of vowel_rl, then one regression-eval run over
    vowel_rl (by store key: within tolerance) and consonant_rl (by registry alias: vowels regressed)."""
    from typer.testing import CliRunner

    from cascade.flows.cli import app
    from cascade.flows.regression_eval import regression_eval_flow

    started = time.time()
    result = CliRunner().invoke(
        app, ["baseline", "set", "nightly", "runs/toy/evals/00-vowel_rl.json", "--recipe", toy["path"]]
    )
    assert result.exit_code == 0, result.output
    before = load_baseline(toy["store"], "nightly")
    state = regression_eval_flow(
        toy["path"], ["runs/toy/00-vowel_rl", ALIAS], "nightly", update_baseline=True, return_state=True
    )
    found = state.result(raise_on_failure=False)
    return {"rows": found.rows, "before": before, "started": started, "state": state, "found": found}


def test_a_regression_ends_the_flow_run_failed_naming_the_drop(regression_run, prefect_api):
    from cascade.stages.evals.regression import RegressionFound

    state, found = regression_run["state"], regression_run["found"]
    assert state.is_failed() and isinstance(found, RegressionFound)
    assert str(found).startswith(f"1 regression(s) against baseline 'nightly': {ALIAS} vowels ")
    stored = api(prefect_api, "GET", f"/flow_runs/{state.state_details.flow_run_id}")
    assert stored["state_type"] == "FAILED" and "regression(s) against baseline 'nightly'" in stored["state"]["message"]


def regression_events(base: str, since: float, baseline: str) -> list[dict]:
    body = {
        "filter": {
            "event": {"name": ["cascade.regression.detected"]},
            "occurred": {"since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since - 1))},
        },
        "limit": 50,
    }
    return [e for e in api(base, "POST", "/events/filter", body)["events"] if e["payload"]["baseline"] == baseline]


def test_regression_eval_deployment_has_its_cron_schedule(deployed, prefect_api):
    from cascade.infra.deploy import runner_deployments
    from cascade.infra.deployments import DEPLOYMENTS

    stored = api(prefect_api, "GET", "/deployments/name/regression-eval/nightly")
    assert stored["id"] == str(deployed["regression-eval"])
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"], s["active"]) for s in stored["schedules"]] == [
        ("0 3 * * *", "UTC", True)
    ]
    nightly = next(spec for spec in DEPLOYMENTS if spec.name == "nightly")
    [custom] = runner_deployments([dataclasses.replace(nightly, cron="30 1 * * 1-5")])
    assert [s.schedule.cron for s in custom.schedules] == ["30 1 * * 1-5"]
    assert api(prefect_api, "GET", "/deployments/name/recover/recover")["id"] == str(deployed["recover"])


def test_ensure_automations_is_idempotent(deployed, prefect_api):
    from cascade.infra.automations import AUTOMATION_NAME, ensure_automations

    ensure_automations()
    found = [a for a in api(prefect_api, "POST", "/automations/filter", {}) if a["name"] == AUTOMATION_NAME]
    assert len(found) == 1
    automation = found[0]
    assert automation["trigger"]["expect"] == ["cascade.regression.detected"]
    assert automation["trigger"]["posture"] == "Reactive" and automation["trigger"]["threshold"] == 1
    [action] = automation["actions"]
    assert action["type"] == "run-deployment" and action["deployment_id"] == str(deployed["recover"])
    assert action["parameters"] == {
        "recipe": "{{ event.payload.recipe }}",
        "baseline": "{{ event.payload.baseline }}",
        "student": "{{ event.payload.checkpoint_uri }}",
    }


def test_table_compares_real_evals_with_the_baseline(toy, regression_run):
    store, rows, before = toy["store"], regression_run["rows"], regression_run["before"]
    cascade_eval = json.loads(store.read_bytes("runs/toy/evals/00-vowel_rl.json"))
    # a domain's bar is its dev score (the held-out column only records); greedy and pass@k are not bars
    dev = {d: cascade_eval["scores"][f"dev/{d}"] for d in ("vowels", "consonants")}
    assert {d: e.score for d, e in before.domains.items()} == dev
    assert {e.uri for e in before.domains.values()} == {cascade_eval["model"]}
    table = {(r["checkpoint"], r["domain"]): r for r in rows}
    assert set(table) == {(c, d) for c in ("runs/toy/00-vowel_rl", ALIAS) for d in ("vowels", "consonants")}
    # vowel_rl re-evaluated by the flow scores exactly what the cascade's eval stored: drop 0, within tolerance
    for d in ("vowels", "consonants"):
        assert table[("runs/toy/00-vowel_rl", d)]["score"] == dev[d]
        assert table[("runs/toy/00-vowel_rl", d)]["column"] == f"dev/{d}"
        assert table[("runs/toy/00-vowel_rl", d)]["drop"] == 0.0
        assert table[("runs/toy/00-vowel_rl", d)]["verdict"] == "ok"
    # consonant_rl (by alias) lost the vowels: the drop is the baseline minus its real score
    cascade_consonant = json.loads(store.read_bytes("runs/toy/evals/01-consonant_rl.json"))["scores"]
    vowels = table[(ALIAS, "vowels")]
    assert vowels["score"] == cascade_consonant["dev/vowels"]
    assert vowels["drop"] == pytest.approx(dev["vowels"] - cascade_consonant["dev/vowels"], abs=1e-4)
    assert vowels["drop"] > vowels["tolerance"] == 0.05 and vowels["verdict"] == "regressed"
    assert table[(ALIAS, "consonants")]["verdict"] == "ok"
    # the same table is in the store; update_baseline ratcheted consonants up to consonant_rl's score
    assert rows in [
        json.loads(store.read_bytes(f"regression/{d}/verdicts.json")) for d in store.list_dirs("regression")
    ]
    after = load_baseline(store, "nightly")
    assert after.domains["vowels"] == before.domains["vowels"]
    assert after.domains["consonants"].score == cascade_consonant["dev/consonants"] > before.domains["consonants"].score
    assert after.domains["consonants"].checkpoint == ALIAS
    assert after.domains["consonants"].uri == store.uri("runs/toy/01-consonant_rl")


def test_table_artifact_is_on_the_server(regression_run, prefect_api):
    found = api(prefect_api, "POST", "/artifacts/filter", {"artifacts": {"key": {"any_": ["regression-nightly"]}}})
    assert found and found[0]["type"] == "table"
    shown = json.loads(found[0]["data"])
    assert shown == shown_rows(regression_run["rows"])  # 3 decimals, as the terminal prints them
    assert all(round(v, 3) == v for row in shown for v in row.values() if isinstance(v, float))
    assert any(v != round(v, 3) for row in regression_run["rows"] for v in row.values() if isinstance(v, float))


def test_regressed_checkpoint_emits_one_event_with_domain_and_drop(regression_run, prefect_api, toy):
    events = poll(lambda: regression_events(prefect_api, regression_run["started"], "nightly"))
    # vowel_rl was evaluated first in the same run: an event of it would have been persisted no later than this one
    assert len(events) == 1, "one event per regressed checkpoint; vowel_rl is within tolerance and emits none"
    [event] = events
    vowels = next(r for r in regression_run["rows"] if r["checkpoint"] == ALIAS and r["domain"] == "vowels")
    assert event["resource"]["prefect.resource.id"] == f"cascade.checkpoint.{ALIAS}"
    assert event["resource"]["cascade.checkpoint.uri"] == toy["store"].uri("runs/toy/01-consonant_rl")
    assert event["payload"]["regressions"] == [
        {k: vowels[k] for k in ("domain", "score", "baseline", "drop", "tolerance")}
    ]
    assert event["payload"]["recipe"] == toy["path"] and event["payload"]["baseline"] == "nightly"
    domains = [r for r in event["related"] if r["prefect.resource.role"] == "regressed-domain"]
    assert domains == [
        {
            "prefect.resource.id": "cascade.domain.vowels",
            "prefect.resource.role": "regressed-domain",
            "cascade.drop": str(vowels["drop"]),
        }
    ]


def test_automation_starts_recover_with_parameters_from_the_event(regression_run, deployed, prefect_api, toy):
    def recover_runs():
        body = {"deployments": {"id": {"any_": [str(deployed["recover"])]}}}
        return [
            r
            for r in api(prefect_api, "POST", "/flow_runs/filter", body)
            if r["parameters"].get("baseline") == "nightly"
        ]

    [run] = poll(recover_runs, timeout=30)
    assert run["parameters"] == {
        "recipe": toy["path"],
        "baseline": "nightly",
        "student": toy["store"].uri("runs/toy/01-consonant_rl"),
    }


def test_recover_flow_distills_best_teachers_and_says_plainly_what_it_did_not_recover(regression_run, toy):
    """MOPD from the baseline's checkpoints lifts vowels, but not back to the baseline on this toy: the flow run
    ends Failed (NotRecovered, naming each domain still below) and the run's report says so. (It prints the
    verdicts as verdict_lines writes them, tested above.)"""
    from cascade.artifacts.report import RunReport
    from cascade.flows.recover import recover_flow

    store = toy["store"]
    student = store.uri("runs/toy/01-consonant_rl")
    state = recover_flow(
        student=student, recipe=toy["path"], baseline="nightly", run_id="recover-toy", return_state=True
    )
    manifest = read_manifest(store, "runs/recover-toy/00-recover")
    assert manifest["parent"]["stage"] == "consonant_rl"
    # teachers: per domain, the checkpoint holding the (ratcheted) baseline score
    assert manifest["metrics"]["teachers"] == {"consonants": "consonant_rl", "vowels": "vowel_rl"}
    before = json.loads(store.read_bytes("runs/toy/evals/01-consonant_rl.json"))["scores"]
    after = json.loads(store.read_bytes("runs/recover-toy/evals/00-recover.json"))
    assert after["model"] == store.uri("runs/recover-toy/00-recover")
    assert after["scores"]["vowels"] > before["vowels"] + 0.05  # distilled towards the vowel teacher
    found = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(found, NotRecovered)
    baseline = load_baseline(store, "nightly")
    still_below = [r["domain"] for r in regressions(found.rows)]
    assert still_below == sorted(d for d, e in baseline.domains.items() if e.score - after["scores"][d] > 0.05)
    assert "vowels" in still_below and {r["domain"]: r["baseline"] for r in found.rows} == {
        d: e.score for d, e in baseline.domains.items()
    }
    report = RunReport.load(store, "recover-toy")
    assert report.status == "FAILED" and report.stopped.startswith("NotRecovered: ")


# --- the CLI ---------------------------------------------------------------------------------------------------


def test_cli_sets_a_baseline_from_a_checkpoint_and_regression_eval_exits_1_on_a_regression(regression_run, toy):
    from typer.testing import CliRunner

    from cascade.flows.cli import app

    cli = CliRunner()
    result = cli.invoke(app, ["baseline", "set", "cli", "runs/toy/00-vowel_rl", "--recipe", toy["path"]])
    assert result.exit_code == 0, result.output
    cascade_eval = json.loads(toy["store"].read_bytes("runs/toy/evals/00-vowel_rl.json"))["scores"]
    dev = {d: cascade_eval[f"dev/{d}"] for d in ("vowels", "consonants")}  # a domain's bar is its dev score
    assert {d: e.score for d, e in load_baseline(toy["store"], "cli").domains.items()} == dev
    ok = cli.invoke(
        app,
        [
            "regression-eval",
            "--recipe",
            toy["path"],
            "--checkpoint",
            "runs/toy/00-vowel_rl",
            "--baseline",
            "cli",
            "--json",
        ],
    )
    assert ok.exit_code == 0, ok.output
    assert {r["domain"]: r["verdict"] for r in json.loads(ok.stdout.splitlines()[-1])} == {
        "vowels": "ok",
        "consonants": "ok",
    }
    bad = cli.invoke(app, ["regression-eval", "--recipe", toy["path"], "--checkpoint", ALIAS, "--baseline", "cli"])
    assert bad.exit_code == 1 and "regressed" in bad.stdout
    unknown = cli.invoke(
        app, ["regression-eval", "--recipe", toy["path"], "--checkpoint", "models:/cascade-toy-regression@stage-nope"]
    )
    assert unknown.exit_code == 2 and unknown.stderr.count("\n") == 1
    assert "models:/cascade-toy-regression@stage-nope: Registered model alias stage-nope not found" in unknown.stderr


TINY = ["--recipe", "tiny"]


@pytest.mark.parametrize(
    "scores, message",
    [
        ({"math": float("nan")}, "score of 'math' is nan; a baseline takes scores in [0, 1]"),
        ({"math": float("inf")}, "score of 'math' is inf"),
        ({"math": -1e308}, "score of 'math' is -1e+308"),
        ({}, "holds no score to compare with"),
        ({"greedy/math": 0.5}, "holds no score to compare with"),
        ({"chess": 0.5}, "scores none of recipe 'micro''s gated columns (instruct, math)"),
    ],
    ids=["nan", "inf", "out-of-range", "empty", "side-columns-only", "foreign-domain"],
)
def test_a_baseline_that_could_never_fail_is_refused_one_line_nothing_written(tmp_path, cascade_home, scores, message):
    from typer.testing import CliRunner

    from cascade.flows.cli import app

    record = tmp_path / "record.json"
    record.write_text(json.dumps({"model": "file:///s/runs/r/01-sft", "scores": scores}))  # NaN as JSON allows it
    result = CliRunner().invoke(app, ["baseline", "set", "nightly", str(record), "--recipe", "micro"])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not Path(cascade_home).exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["baseline", "set", "Bad Name!", "x.json"], "bad baseline name 'Bad Name!'"),
        (["baseline", "set", "nightly", "runs/nope/evals/00-x.json"], "no eval record runs/nope/evals/00-x.json"),
        (["baseline", "set", "nightly", "runs/nope/00-x"], "runs/nope/00-x: no committed checkpoint at"),
        (["baseline", "show", "missing"], "no baseline 'missing'"),
        (["regression-eval", *TINY, "--checkpoint", "runs/nope/00-x"], "runs/nope/00-x: no committed checkpoint at"),
        (["regression-eval", *TINY, "--checkpoint", "models:/cascade-x@best-math"], "no model registry at"),
        (["regression-eval", "--baseline", "UPPER"], "bad baseline name 'UPPER'"),
        (["regression-eval", *TINY, "--checkpoint", "s3://elsewhere/runs/x/00-sft"], "is outside the recipe's store"),
        (["regression-eval", "--recipe", "nope"], "unknown recipe 'nope'"),
        (["regression-eval", *TINY], "models:/cascade-tiny@stage-math_rl: no model registry at"),  # its default
        (["regression-eval"], "no recipe given and no finished run in file://"),  # the newest finished run's
    ],
)
def test_cli_bad_input_is_one_line_exit_2_nothing_written(tmp_path, cascade_home, args, message):
    from typer.testing import CliRunner

    from cascade.flows.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert not Path(cascade_home).exists()


@pytest.mark.parametrize(
    "blob, message",
    [
        (b'{"name": "nightly", "domains": {"math": {"score": 0.5, "chec', "Invalid JSON: EOF while parsing a string"),
        (b"[1, 2]", "Input should be an object"),
        (b'{"name": "nightly", "domains": {"math": {"score": "high"}}}', "domains.math.score: Input should be a valid"),
    ],
    ids=["torn", "foreign", "bad-score"],
)
def test_a_torn_baseline_is_one_line_exit_2_nothing_written(cascade_home, blob, message):
    """`cascade baseline show` of a torn baseline file printed pydantic's traceback."""
    from typer.testing import CliRunner

    from cascade.flows.cli import app

    baseline = Path(cascade_home) / "baselines" / "nightly.json"
    baseline.parent.mkdir(parents=True)
    baseline.write_bytes(blob)
    result = CliRunner().invoke(app, ["baseline", "show", "nightly", "--recipe", "micro"])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    assert f"cascade: error: file://{baseline} is not a valid baseline: {message}" in result.stderr
    assert [p for p in Path(cascade_home).rglob("*") if p.is_file()] == [baseline]


def test_the_nightly_default_after_a_store_move_finds_the_run_and_its_checkpoint_where_the_store_is_now(
    tmp_path, cascade_home, monkeypatch
):
    """A run's report and recipe name the store where the run ran. After the store moved (`cascade resume RUN --store
    NEW` continues there), a regression eval given no recipe found no finished run in it, and with the run found,
    the run's recipe pointed the eval at the old store for its checkpoint and its writes."""
    from cascade.artifacts.checkpoint import write_checkpoint
    from cascade.artifacts.layout import recipe_key, stage_key
    from cascade.artifacts.report import EvalScores, RunReport, StageRecord
    from cascade.flows.recipes import load_any_recipe, load_recipe
    from cascade.tasks.regression_tasks import eval_targets, resolve_checkpoint

    old, new = tmp_path / "old-store", tmp_path / "new-store"
    recipe = load_recipe("micro", [f"storage.root=file://{old}"])
    store = Store.from_config(recipe.storage)
    store.write_bytes(recipe_key("moved"), recipe.model_dump_json().encode())
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"weights")
    ref = write_checkpoint(
        store, stage_key("moved", 1, "sft"), tmp_path / "model", stage="sft", step=None, parent=None, config_hash="c"
    )
    sft = StageRecord(name="sft", kind="sft", status="completed", checkpoint=ref.uri)
    RunReport(
        run_id="moved",
        recipe="micro",
        stages=[sft],
        evals=[EvalScores(after_stage="sft", scores={})],
        status="FINISHED",
    ).save(store)
    old.rename(new)
    monkeypatch.setenv("CASCADE_STORE", f"file://{new}")

    recipe_uri, checkpoints = eval_targets(None, None)
    assert (recipe_uri, checkpoints) == (f"file://{new}/runs/moved/recipe.json", [f"file://{new}/runs/moved/01-sft"])
    loaded = load_any_recipe(recipe_uri)
    assert loaded.storage.root == f"file://{new}"  # the eval's records and baseline are written there
    resolved = resolve_checkpoint(loaded, checkpoints[0])
    assert (resolved.uri, resolved.digest) == (f"file://{new}/runs/moved/01-sft", ref.digest)
    assert not old.exists()
