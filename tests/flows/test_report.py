"""The HTML run report of a real micro run: written by the flow (also after a failure, for what exists), logged to
MLflow, rendered by `cascade report --html` and shown in headless Chromium; two runs side by side; bad input.

One run for the module: its if_rl stage fails at its last step (the test-only hook CASCADE_TEST_FAIL_STAGE), the
stopped run's store is kept as a second run, then the run is resumed to the end. The screenshot goes to
tests/artifacts-out/report.png (`make docs-img` copies it to docs/img/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cascade.artifacts.steplog import read_run
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from tests.conftest import micro_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "tests" / "artifacts-out"
TRAINING = ["sft", "if_rl", "math_rl"]


class Run:
    def __init__(self, root: Path):
        self.root, self.recipe = root, micro_recipe(root)
        self.store = Store.from_config(self.recipe.storage)
        self.runs = root / "store" / "runs"
        self.stopped_html = ""

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, CASCADE_HOME=str(self.root / "home"))
        return subprocess.run(
            [sys.executable, "-m", "cascade.flows.cli", *args, "--store", f"file://{self.root}/store"],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=120,
        )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    r = Run(tmp_path_factory.mktemp("report"))
    with pytest.MonkeyPatch.context() as mp:  # module scope: set up before the per-test CASCADE_HOME
        mp.setenv("CASCADE_HOME", str(r.root / "home"))  # MLflow's artifacts go there
        mp.setenv("CASCADE_TEST_FAIL_STAGE", "rep/if_rl")
        with pytest.raises(Exception, match="CASCADE_TEST_FAIL_STAGE"):
            cascade_flow(r.recipe, "rep")
        mp.delenv("CASCADE_TEST_FAIL_STAGE")
        r.stopped_html = (r.runs / "rep" / "report.html").read_text()
        # the stopped run, kept under its own id: the second run of the comparison
        shutil.copytree(r.runs / "rep", r.runs / "stopped", ignore=shutil.ignore_patterns("LEASE.json"))
        path = r.runs / "stopped" / "report.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "run_id": "stopped"}))
        cascade_flow(r.recipe, "rep")  # resume: the failed stage continues from its step checkpoint
    return r


def test_a_failed_run_gets_a_report_of_what_exists(run):
    html = run.stopped_html
    assert "stopped at stage if_rl: InjectedFault: CASCADE_TEST_FAIL_STAGE" in html and "not run: math_rl" in html
    assert 'data-stage="sft"' in html and 'data-stage="if_rl"' in html  # the curves up to the failure
    assert 'class="plot heatmap"' in html


def test_the_step_logs_are_exact_across_the_resume(run):
    steps = read_run(run.store, "rep")
    assert {name: [r["step"] for r in rows] for name, rows in steps.items()} == {
        "sft": [1, 2, 3, 4, 5, 6],
        "if_rl": [1, 2],
        "math_rl": [1, 2],
    }
    assert all("tokens_sampled" in r["metrics"] for r in steps["if_rl"])


def test_the_flow_logs_the_report_and_its_plots_to_mlflow(run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=run.recipe.tracking.resolved_uri())
    experiment = client.get_experiment_by_name(run.recipe.tracking.experiment)
    parent = client.search_runs(
        [experiment.experiment_id], "tags.`cascade.run_id` = 'rep' and attributes.run_name = 'rep'"
    )[0]
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert "report.html" in names
    assert {"plots/forgetting_matrix.png", *(f"plots/curves-{s}.png" for s in TRAINING)} <= plots
    assert parent.info.status == "FINISHED"


def test_cascade_report_html_renders_in_a_browser(run, chromium, tmp_path):
    out = tmp_path / "report.html"
    result = run.cli("report", "rep", "--html", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"html report: {out}" in result.stdout and "math_rl" in result.stdout  # and the matrix
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(out.as_uri())
    page.wait_for_load_state("load")
    assert errors == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []  # self-contained: no network
    for section in ("matrix", "curves", "data", "gate", "cost", "links"):
        assert page.locator(f"section#{section}").is_visible(), section
    loaded = "img => img.complete && img.naturalWidth > 0"
    heatmap = page.locator("img.heatmap")
    assert heatmap.count() == 1 and heatmap.evaluate(loaded)
    for stage in TRAINING:
        curve = page.locator(f'img.curve[data-stage="{stage}"]')
        assert curve.count() == 1 and curve.evaluate(loaded), stage
    assert page.locator("img.pass-rates").evaluate(loaded)
    assert "finished" in page.locator("p.banner").inner_text()
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=SHOTS / "report.png", full_page=True)


def test_two_runs_side_by_side(run, tmp_path):
    out = tmp_path / "compare.html"
    result = run.cli("report", "rep", "stopped", "--html", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    html = out.read_text()
    assert html.count('class="plot heatmap"') == 2 and "<h3>rep</h3>" in html and "<h3>stopped</h3>" in html
    assert "stopped at stage if_rl" in html and "Solid: rep; dashed: stopped" in html


def test_html_alone_writes_beside_report_json(run):
    result = run.cli("report", "rep", "--html")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"html report: file://{run.runs}/rep/report.html" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["report", "no-such-run", "--html", "{tmp}/r.html"], "unknown run id 'no-such-run'"),
        (["report", "rep", "--html", "{tmp}/no/such/dir/r.html"], "cannot write"),
        (["report", "rep", "--html", "{tmp}"], "it is a directory"),
        (["report", "rep", "a", "b"], "report takes one run id, or two to compare"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(run, tmp_path, args, message):
    """In-process (the CLI's own entry point and error handling, without a new interpreter per case)."""
    from typer.testing import CliRunner

    from cascade.flows.cli import app, optional_values

    argv = [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--store", f"file://{run.root}/store"]
    result = CliRunner().invoke(app, optional_values(argv))
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == "" and list(tmp_path.iterdir()) == []
