"""`cascade deploy` against a real Prefect server: the typed `cascade` deployment, a run started from the terminal
as docs/DEPLOYMENTS.md says, one from the API that fails and its Retry keeping completed stages, the nightly, and
a run started from the UI in headless Chromium.

One server and one `cascade deploy` (serving) for the module. The fault run uses the test-only hook
`CASCADE_TEST_FAIL_STAGE` (tasks/progress.py): its if_rl stage (the fourth, after the difficulty
filter) fails on the first attempt of the flow run.
Screenshots go to tests/artifacts-out/ (`make docs-img` copies them to docs/img/).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from cascade.infra.deployments import DEPLOYMENTS
from cascade.infra.prefect_server import free_port, start_server, stop

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "tests" / "artifacts-out"
FAULT_RUN = "deploy-fault"
RUN_TIMEOUT_S = 420  # a micro run is ~1 min on an idle core; the module shares the machine with other tests
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@dataclass
class Deployed:
    api: httpx.Client
    api_url: str
    ui_url: str
    home: Path  # CASCADE_HOME of the serving process: the store is file://home
    env: dict[str, str]
    deployment: dict
    log: Path  # what `cascade deploy` printed

    def start(self, **request) -> str:
        return (
            self.post(
                f"/deployments/{self.deployment['id']}/create_flow_run", json={"parameters": {"request": request}}
            )
            .raise_for_status()
            .json()["id"]
        )

    def post(self, path: str, **kwargs) -> httpx.Response:
        return self.call("POST", path, **kwargs)

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A request, retrying the 503 a busy sqlite server answers under load."""
        for _ in range(10):
            r = self.api.request(method, path, **kwargs)
            if r.status_code != 503:
                return r
            time.sleep(2)
        return r

    def flow_run(self, run_id: str) -> dict:
        return self.call("GET", f"/flow_runs/{run_id}").raise_for_status().json()

    def wait(self, run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.flow_run(run_id)
            if run["state_type"] in TERMINAL and run["state_name"] != "AwaitingRetry":
                return run
            time.sleep(1)
        raise AssertionError(f"flow run {run_id} not finished after {timeout} s: {run['state_name']}")

    def why(self, run_id: str) -> str:
        """The state message and the last error logs of a flow run, for assertion messages."""
        logs = self.post(
            "/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}, "level": {"ge_": 40}}, "limit": 5}
        ).json()
        return self.flow_run(run_id)["state"]["message"] + "\n" + "\n".join(log["message"][-1500:] for log in logs)

    def task_runs(self, run_id: str) -> list[dict]:
        r = self.post(
            "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}, "sort": "EXPECTED_START_TIME_ASC"}
        )
        return r.raise_for_status().json()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    port = free_port()
    env = dict(
        os.environ,
        PREFECT_HOME=str(root / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        CASCADE_HOME=str(root / "home"),
        PYTHONPATH=str(ROOT),
        PREFECT_RUNNER_POLL_FREQUENCY="1",
        PREFECT_LOGGING_LEVEL="INFO",
        OMP_NUM_THREADS="1",
    )
    for leftover in ("PREFECT_API_URL", "CASCADE_STORE", "MLFLOW_TRACKING_URI"):
        env.pop(leftover, None)
    server, api_url = start_server(root / "prefect-home", port, root / "server.log")  # what deploy starts, too
    env["PREFECT_API_URL"] = api_url
    deployer = None
    try:
        with open(root / "deploy.log", "wb") as log:
            deployer = subprocess.Popen(
                [sys.executable, "-m", "cascade.flows.cli", "deploy"],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env, CASCADE_TEST_FAIL_STAGE=f"{FAULT_RUN}/if_rl"),
            )
        api = httpx.Client(base_url=api_url, timeout=30)
        deployment = _wait_for_deployment(api, deployer, root / "deploy.log")
        yield Deployed(api, api_url, f"http://127.0.0.1:{port}", root / "home", env, deployment, root / "deploy.log")
    finally:
        if deployer is not None:
            stop(deployer, grace=20)
        stop(server, grace=20)


def _wait_for_deployment(api: httpx.Client, deployer: subprocess.Popen, log: Path) -> dict:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert deployer.poll() is None, f"cascade deploy exited: {log.read_text()[-2000:]}"
        r = api.get("/deployments/name/cascade/cascade")
        if r.status_code == 200 and "export PREFECT_API_URL=" in log.read_text():
            return r.json()
        time.sleep(1)
    raise AssertionError(f"cascade deployment not registered: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def api_runs(deployed):
    """The completing run, started from the terminal as docs/DEPLOYMENTS.md says, and the failing run, started
    through the API, together: their training stages take turns on the limit."""
    return {"ok": _run_the_docs_terminal_trigger(deployed), "fault": deployed.start(recipe="micro", run_id=FAULT_RUN)}


def _run_the_docs_terminal_trigger(deployed: Deployed) -> str:
    """DEPLOYMENTS.md's `prefect deployment run ...` line, run in a shell with the exported PREFECT_API_URL that
    `cascade deploy` printed; returns the id of the flow run it started."""
    doc = (ROOT / "docs" / "DEPLOYMENTS.md").read_text()
    command = re.search(r"`(prefect deployment run\s+cascade/cascade [^`]+)`", doc).group(1)
    export = next(line for line in deployed.log.read_text().splitlines() if "export PREFECT_API_URL=" in line)
    api_url = export.split("export PREFECT_API_URL=", 1)[1]
    prefect = str(Path(sys.executable).with_name("prefect"))
    done = subprocess.run(
        [prefect, *shlex.split(" ".join(command.split()))[1:]],
        capture_output=True,
        text=True,
        env=dict(deployed.env, PREFECT_API_URL=api_url),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"UUID: ([0-9a-f-]{36})", done.stdout).group(1)


def test_deploy_says_how_another_shell_reaches_its_server(deployed):
    lines = deployed.log.read_text().splitlines()
    assert f"in another shell: export PREFECT_API_URL={deployed.api_url}" in lines


def test_cascade_deployment_has_a_typed_form(deployed):
    schema = deployed.deployment["parameter_openapi_schema"]
    form = schema["definitions"]["RunRequest"]["properties"]
    assert form["recipe"]["enum"] == [
        "micro",
        "nemotron-cascade-2",
        "smollm2-cascade",
        "smollm2-gsm8k",
        "smollm2-if",
        "tiny",
        "tiny-all",
        "tiny-paper",
        "tiny-regression",
        "tiny-rlhf",
    ]
    assert {
        "enum": ["chat", "code", "instruct", "longctx", "math", "mcqa", "structured", "swe", "tool"],
        "type": "string",
    } == form["domains"]["anyOf"][0]["items"]
    assert form["steps"]["anyOf"][0] == {"minimum": 1, "maximum": 1_000_000, "type": "integer"}
    assert deployed.deployment["enforce_parameter_schema"] is True
    # bad input is refused by the server before a run exists
    for bad in ({"recipe": "nope"}, {"steps": -3}, {"steps": 10**7}, {"domains": ["poetry"]}, {"run_id": "Bad ID!"}):
        r = deployed.post(
            f"/deployments/{deployed.deployment['id']}/create_flow_run", json={"parameters": {"request": bad}}
        )
        assert r.status_code == 409, (bad, r.text)
    limit = deployed.api.get("/v2/concurrency_limits/compute").raise_for_status().json()
    assert limit["limit"] == 1


def test_prefect_yaml_declares_the_registry():
    declared = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]
    assert [(d["name"], d["entrypoint"]) for d in declared] == [(s.name, s.entrypoint) for s in DEPLOYMENTS]


def test_the_terminal_trigger_in_the_docs_starts_a_run_that_completes_with_its_report(deployed, api_runs):
    run = deployed.wait(api_runs["ok"])
    assert run["state_type"] == "COMPLETED", deployed.why(run["id"])
    assert run["parameters"]["request"] == {"recipe": "micro", "steps": 3}
    ok = run["name"]  # the run id of a form without one: recipe + flow run id
    assert ok == f"micro-{run['id'][:8]}"
    names = [t["name"] for t in deployed.task_runs(run["id"])]
    assert f"micro/{ok}/03-grpo-if_rl" in names and f"micro/{ok}/eval-after-math_rl" in names
    artifacts = deployed.post("/artifacts/filter", json={"flow_runs": {"id": {"any_": [run["id"]]}}}).json()
    kinds = sorted({a["type"] for a in artifacts})
    assert kinds == ["markdown", "progress", "table"]
    assert len([a for a in artifacts if a["type"] == "progress"]) == 5  # one per stage
    assert all(a["data"] == 100.0 for a in artifacts if a["type"] == "progress")
    links = next(a for a in artifacts if a["key"] == f"{ok}-links")["data"]
    assert "MLflow run" in links and f"file://{deployed.home}/runs/{ok}/report.json" in links
    # the run report: written beside report.json, linked from the flow run, in the MLflow parent run
    html_uri = f"file://{deployed.home}/runs/{ok}/report.html"
    report_md = next(a for a in artifacts if a["key"] == f"{ok}-report")["data"]
    assert f"- in the store: `{html_uri}`" in report_md and "in MLflow: artifact `report.html`" in report_md
    assert "](file:" not in report_md and "](sqlite:" not in report_md  # no link a browser cannot open
    html = (deployed.home / "runs" / ok / "report.html").read_text()
    assert f"/flow-run/{run['id']}" in html  # the Prefect flow run's page (Prefect's own ui_url)
    assert f"<b>{ok}</b> (micro) finished" in html
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{deployed.home}/mlflow.db")
    experiment = client.get_experiment_by_name("cascade")
    parent = [
        r
        for r in client.search_runs([experiment.experiment_id], f"tags.`cascade.run_id` = '{ok}'")
        if "mlflow.parentRunId" not in r.data.tags
    ]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert "report.html" in {a.path for a in client.list_artifacts(parent[0].info.run_id)}
    plots = {a.path for a in client.list_artifacts(parent[0].info.run_id, "plots")}
    assert {"plots/forgetting_matrix.png", "plots/curves-sft.png", "plots/curves-if_rl.png"} <= plots


def test_the_nightly_fires_with_its_defaults_and_completes(deployed, api_runs):
    """Deployed before any run finished, the nightly's schedule is paused and `cascade deploy` says why; fired
    once a run has finished, with no parameters, it evaluates that run's final checkpoint with the run's own recipe
    and, the baseline not existing yet, sets it."""
    assert "nightly: paused:" in deployed.log.read_text()
    nightly = deployed.call("GET", "/deployments/name/regression-eval/nightly").raise_for_status().json()
    assert nightly["paused"] and nightly["parameters"] == {"baseline": "nightly"}
    assert deployed.wait(api_runs["ok"])["state_type"] == "COMPLETED"
    flow_run = deployed.post(f"/deployments/{nightly['id']}/create_flow_run", json={}).raise_for_status().json()
    run = deployed.wait(flow_run["id"])
    assert run["state_type"] == "COMPLETED", deployed.why(run["id"])
    (verdicts,) = (deployed.home / "regression").glob("*/verdicts.json")
    rows = json.loads(verdicts.read_text())
    ok = deployed.flow_run(api_runs["ok"])["name"]
    finals = {f"file://{deployed.home}/runs/{r}/04-math_rl" for r in (ok, FAULT_RUN)}
    assert {r["checkpoint"] for r in rows} <= finals and {r["verdict"] for r in rows} == {"no baseline"}
    assert {r["domain"] for r in rows} == {"math", "instruct"}
    baseline = json.loads((deployed.home / "baselines" / "nightly.json").read_text())
    assert {d: e["uri"] for d, e in baseline["domains"].items()} == {
        d: rows[0]["checkpoint"] for d in ("math", "instruct")
    }


def _manifests(home: Path, run_id: str) -> dict[str, bytes]:
    return {
        str(p.relative_to(home / "runs" / run_id)): p.read_bytes()
        for p in sorted((home / "runs" / run_id).glob("**/MANIFEST.json"))
    }


def test_retry_of_a_failed_run_keeps_completed_stages(deployed, api_runs):
    failed = deployed.wait(api_runs["fault"])
    assert failed["state_type"] == "FAILED", deployed.why(failed["id"])
    assert "CASCADE_TEST_FAIL_STAGE: if_rl of deploy-fault fails at step 2" in deployed.why(failed["id"])
    before = _manifests(deployed.home, FAULT_RUN)
    # stages 1-3 committed; stage 4 (if_rl) committed its step-1 checkpoint, then failed at its last step
    assert set(before) == {
        "00-sft_data/MANIFEST.json",
        "01-sft/steps/3/MANIFEST.json",
        "01-sft/MANIFEST.json",
        "02-difficulty/MANIFEST.json",
        "03-if_rl/steps/1/MANIFEST.json",
    }
    first_attempt = {t["id"] for t in deployed.task_runs(failed["id"])}

    retry = subprocess.run(
        [sys.executable, "-m", "prefect", "flow-run", "retry", failed["id"]],
        env=deployed.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert retry.returncode == 0, retry.stdout + retry.stderr
    done = deployed.wait(failed["id"])
    assert done["state_type"] == "COMPLETED", deployed.why(done["id"])
    assert done["run_count"] == 2

    second = {t["name"]: t["state_name"] for t in deployed.task_runs(failed["id"]) if t["id"] not in first_attempt}
    prefix = f"micro/{FAULT_RUN}/"
    assert second[prefix + "00-sft_data-sft_data"] == "Cached"
    assert second[prefix + "01-sft-sft"] == "Cached"
    assert second[prefix + "02-difficulty-difficulty"] == "Cached"
    assert second[prefix + "03-grpo-if_rl"] == "Completed"
    assert second[prefix + "04-grpo-math_rl"] == "Completed"
    after = _manifests(deployed.home, FAULT_RUN)
    # nothing committed before the failure was rewritten: stages 1-3 were not re-run, and stage 4 went on
    # from its step-1 checkpoint instead of starting over
    assert {k: after[k] for k in before} == before
    assert "03-if_rl/MANIFEST.json" in after and "04-math_rl/MANIFEST.json" in after


def test_run_from_the_ui_in_a_real_browser(deployed, chromium):
    SHOTS.mkdir(exist_ok=True)
    known = {r["id"] for r in deployed.post("/flow_runs/filter", json={}).json()}
    page = chromium.new_page(viewport={"width": 1400, "height": 1100})
    page.set_default_timeout(60_000)
    creates = []  # the form's create_flow_run requests, each with its status once answered
    page.on("request", lambda r: creates.append({"url": r.url}) if r.url.endswith("/create_flow_run") else None)
    page.on("response", lambda r: creates[-1].update(status=r.status) if r.url.endswith("/create_flow_run") else None)
    page.goto(f"{deployed.ui_url}/deployments")
    page.wait_for_timeout(3000)  # the dashboard renders after its first API round trips
    page.screenshot(path=SHOTS / "deployments.png")
    page.locator('a[href*="/deployments/deployment/"]', has_text="cascade").first.click()
    form_url = None
    for _ in range(3):  # as a user would: a refused or lost Submit leaves the form, so fill it again
        if form_url:
            page.goto(form_url)
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text("Custom run", exact=True).click()
        page.get_by_text("Recipe (Optional)", exact=True).wait_for()
        form_url = form_url or page.url.rsplit("/run", 1)[0]
        _choose(page, page.locator("button.p-select-button__control").first, "micro")  # the recipe dropdown
        page.screenshot(path=SHOTS / "run-form.png")
        sent, clicked_at = len(creates), time.monotonic()
        page.get_by_role("button", name="Submit").click()
        started = _new_flow_run(deployed, known, give_up=lambda: _submit_failed(page, creates, sent, clicked_at))
        if started or not _submit_failed(page, creates, sent, clicked_at):  # an accepted Submit is not repeated
            break
    if not started:
        page.screenshot(path=SHOTS / "run-form-submitted.png")
        server_log = (deployed.home.parent / "server.log").read_text().splitlines()
        server_errors = [line for line in server_log if "ERROR" in line][-5:]
        raise AssertionError(
            f"submitting the run form created no flow run; its requests: {creates}; the "
            f"server's errors: {server_errors}; the page says: {page.inner_text('body')[-800:]!r}"
        )
    page.goto(f"{deployed.ui_url}/runs/flow-run/{started}")
    page.get_by_text("Completed", exact=True).first.wait_for(timeout=RUN_TIMEOUT_S * 1000)  # the page polls
    page.wait_for_timeout(3000)  # let the task-run graph and artifacts finish rendering
    page.screenshot(path=SHOTS / "run-completed.png")
    run = deployed.flow_run(started)
    assert run["state_type"] == "COMPLETED" and run["parameters"]["request"]["recipe"] == "micro"
    assert run["name"].startswith("micro-")  # recipe + flow run id: the run id, stable across Retry


def _submit_failed(page, creates: list[dict], sent_before: int, clicked_at: float, lost_after_s: float = 60) -> bool:
    """Whether the Submit clicked at `clicked_at`, after `sent_before` requests, failed: its create_flow_run was
    refused (a busy sqlite server answers 503), or none was sent within `lost_after_s` (a lost click)."""
    page.wait_for_timeout(100)  # Playwright's sync API delivers the page's request/response events only in its calls
    mine = creates[sent_before:]
    if not mine:
        return time.monotonic() - clicked_at > lost_after_s
    return mine[-1].get("status", 0) >= 400


def _choose(page, select, option: str, attempts: int = 3) -> None:
    """Pick an option of a Prefect UI dropdown. Headless, it opens from the keyboard (ArrowDown), not a click;
    on a busy machine the first keystroke can land before the control is wired, so try again."""
    from playwright.sync_api import expect

    for _ in range(attempts):
        select.focus()
        page.keyboard.press("ArrowDown")
        choice = page.get_by_role("option", name=option, exact=True)
        try:
            choice.click(timeout=10_000)
            expect(select).to_have_text(option, timeout=10_000)
            return
        except AssertionError:
            continue
        except Exception as e:  # playwright's TimeoutError: the list did not open
            if "Timeout" not in type(e).__name__:
                raise
    raise AssertionError(f"could not choose {option!r} in the dropdown")


def _new_flow_run(deployed: Deployed, known: set[str], give_up) -> str | None:
    """The cascade deployment's new flow run, or None once `give_up()`. Only that deployment's: Prefect's
    scheduler creates the nightly deployment's future runs whenever it gets to them, and one created after `known`
    is not the form's run (that race failed this test twice on a loaded machine, waiting for a run due at 03:00 to
    complete)."""
    only_cascade = {"deployments": {"id": {"any_": [deployed.deployment["id"]]}}}
    # 180 s: in the suite's parallel part the browser shares 2 cores with two other workers (60 s was too short
    # once, 2026-11-26, when this test ran there; the wait costs nothing when the run comes sooner)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        new = [r["id"] for r in deployed.post("/flow_runs/filter", json=only_cascade).json() if r["id"] not in known]
        if new:
            return new[0]
        if give_up():
            return None
        time.sleep(0.5)
    return None


def test_a_restarted_local_server_keeps_its_port_so_earlier_links_still_open(tmp_path):
    """The port of the last local server is remembered under PREFECT_HOME and taken again; Prefect's default
    first; where another process holds the remembered port, a free one, remembered in its turn."""
    import socket

    from cascade.infra.prefect_server import DEFAULT_UI_PORT, PORT_FILE, lasting_port, port_is_free

    first = lasting_port(tmp_path)
    assert first == DEFAULT_UI_PORT or not port_is_free(DEFAULT_UI_PORT)
    assert lasting_port(tmp_path) == first == int((tmp_path / PORT_FILE).read_text())
    (tmp_path / PORT_FILE).write_text(f"{free_port()}\n")
    remembered = int((tmp_path / PORT_FILE).read_text())
    assert lasting_port(tmp_path) == remembered  # the last one's, not the default
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", remembered))
        moved = lasting_port(tmp_path)
    assert moved != remembered and int((tmp_path / PORT_FILE).read_text()) == moved
    (tmp_path / PORT_FILE).write_text("not a port\n")  # a torn file: as if none were remembered
    assert lasting_port(tmp_path) == lasting_port(tmp_path / "fresh")
