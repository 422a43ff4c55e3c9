"""Every command block of the README marked `<!-- runnable -->` runs as written, in order, in one shell.

The fast equivalent: the `micro` recipe in place of `tiny` (the same stage names and shape, seconds instead of
minutes), a temporary CASCADE_HOME, and `cascade` as `python -m cascade.flows.cli` of this checkout.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
    """As on a fresh clone: no PREFECT_API_URL, so each command that runs a flow starts and stops a Prefect server
    of its own. No dependency's WARNING or UserWarning line reaches the user (the compute concurrency limit exists
    on the embedded server), and nothing of Prefect's logging reaches the terminal of the regression eval, run as a
    crontab line runs it (its log lines used to, and to fail to reach the server it had already stopped)."""
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    script = "\n".join(
        [
            "set -euo pipefail",
            f'cascade() {{ "{sys.executable}" -m cascade.flows.cli "$@"; }}',
            f"cd {tmp_path}",
            *(fast(b) for b in blocks),
        ]
    )
    home = tmp_path / "home"
    env = dict(os.environ, CASCADE_HOME=str(home), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", COLUMNS="200")
    for leftover in ("CASCADE_STORE", "MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        env.pop(leftover, None)
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert "Forgetting matrix" in out and f"html report: {tmp_path / 'report.html'}" in out
    assert (tmp_path / "report.html").exists() and (home / "runs" / "first" / "report.html").exists()
    assert "resuming first" in out and "regression eval against baseline 'nightly'" in out
    # no terminal here: each stage's progress is plain lines, its first step and its last among them
    assert re.search(r"^01 sft:sft: 1/6 steps, 0:\d\d$", out, re.M) and re.search(r"^01 sft:sft: 6/6 steps", out, re.M)
    said = out + result.stderr
    assert "WARNING" not in said and "Warning" not in said, said[-3000:]
    assert "| INFO" not in said and "Error logging to API" not in said, said[-3000:]
    links = json.loads((home / "runs" / "first" / "report.json").read_text())["links"]
    assert "prefect" not in links  # the command's own server is gone once it ends: no dead link
    assert links["mlflow"].startswith(f"sqlite:///{home}/mlflow.db#/experiments/")
