"""Every command block of the README marked `<!-- runnable -->` runs as written, in order, in one shell.

The fast equivalent: the `micro` recipe in place of `tiny` (the same stage names and shape, seconds instead of
minutes), a temporary CASCADE_HOME, and `cascade` the command of this checkout's wheel, installed in a fresh venv.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import build_wheel, install_wheel

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- runnable -->\s*\n```bash\n(.*?)```", re.S)


def runnable_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def fast(block: str) -> str:
    return re.sub(r"\btiny\b", "micro", block)


def test_the_readme_marks_its_first_run_and_jobs_runnable():
    """The first run, resume and regression evals; `cascade deploy` (the UI job) serves until stopped, so
    tests/flows/test_deploy.py covers it instead."""
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert len(blocks) == 3
    assert "cascade run tiny" in blocks[0] and "cascade resume" in blocks[1] and "regression-eval" in blocks[2]


def test_the_readme_is_a_front_door_and_results_live_in_docs():
    """At most 150 lines; the only figures with standard errors are in the first run's printed output (a code
    block): results tables are in docs/RESULTS.md."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert "±" not in prose and not re.search(r"[+-]\d+(\.\d+)? SE\b", prose)
    assert "docs/RESULTS.md" in prose and (ROOT / "docs" / "RESULTS.md").is_file()


@pytest.mark.long
@pytest.mark.slow
def test_the_runnable_readme_blocks_run_as_written(tmp_path):
    """As a user who installed the wheel runs them, in a folder outside the checkout: the shipped recipes come from
    the installed package, and nothing is written to the folder but what a command was asked to write there. No
    PREFECT_API_URL, so each command that runs a flow starts and stops a Prefect server of its own. No dependency's
    WARNING or UserWarning line reaches the user (the compute concurrency limit exists on the embedded server), and
    nothing of Prefect's logging reaches the terminal of the regression eval, run as a crontab line runs it (its log
    lines used to, and to fail to reach the server it had already stopped)."""
    venv = tmp_path / "venv"
    env = install_wheel(build_wheel(tmp_path / "wheel"), venv)
    work = tmp_path / "work"
    work.mkdir()
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import cascade.recipes as r; print(r.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert installed.startswith(str(venv)), installed
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    script = "\n".join(["set -euo pipefail", f"export PATH={venv / 'bin'}:$PATH", f"cd {work}", *map(fast, blocks)])
    home = tmp_path / "home"
    env.update(CASCADE_HOME=str(home), COLUMNS="200")
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert "Forgetting matrix" in out and f"html report: {work / 'report.html'}" in out
    assert sorted(p.name for p in work.iterdir()) == ["report.html"]  # what `report first --html report.html` wrote
    assert (home / "runs" / "first" / "report.html").exists()
    assert "resuming first" in out and "regression eval against baseline 'nightly'" in out
    # no terminal here: each stage's progress is plain lines, its first step and its last among them
    assert re.search(r"^01 sft:sft: 1/6 steps, 0:\d\d$", out, re.M) and re.search(r"^01 sft:sft: 6/6 steps", out, re.M)
    assert re.search(r"^02 difficulty:difficulty: 8/8 prompts, ", out, re.M)  # a filter counts what it samples
    said = out + result.stderr
    assert "WARNING" not in said and "Warning" not in said, said[-3000:]
    assert "| INFO" not in said and "Error logging to API" not in said, said[-3000:]
    assert "Downloading artifacts" not in said, said[-3000:]  # MLflow's bars, as the resume logged its tables again
    assert re.search(r"^│ first +│ finished +│ sft_data:completed, sft:completed, ", out, re.M), out[-3000:]
    links = json.loads((home / "runs" / "first" / "report.json").read_text())["links"]
    assert "prefect" not in links  # the command's own server is gone once it ends: no dead link
    # a local MLflow store: the page `mlflow ui` serves, and that command (a sqlite: URI is no page a browser opens)
    assert links["mlflow"].startswith("http://127.0.0.1:5000/#/experiments/")
    assert links["mlflow_ui"] == f"mlflow ui --backend-store-uri sqlite:///{home}/mlflow.db"
