"""What the CLI prints, exactly: the run listing with each run's state, a run with no evals yet, a regression eval's
table. A terminal 100 columns wide."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from cascade.artifacts.report import RunReport, StageRecord
from cascade.artifacts.store import Store
from tests.conftest import micro_recipe

ROOT = Path(__file__).resolve().parents[2]


def cascade(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CASCADE_HOME=str(home), COLUMNS="100")
    command = [sys.executable, "-m", "cascade.flows.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def stored_run(store: Store, run_id: str, status: str | None, stages: list[str], lease: dict | None = None) -> None:
    store.write_bytes(f"runs/{run_id}/recipe.json", micro_recipe(Path("/unused")).model_dump_json().encode())
    report = RunReport(run_id=run_id, recipe="micro", status=status)
    for name in stages:
        report.record_stage(StageRecord(name=name, kind=name, status="completed", seconds=1.5))
    report.save(store)
    if lease is not None:
        store.write_bytes(f"runs/{run_id}/LEASE.json", json.dumps({"token": run_id * 8, **lease}).encode())


def test_the_run_listing_says_whether_each_run_is_running_finished_failed_or_killed(tmp_path):
    """A `kill -9`ed run leaves its lease behind, its owner gone (on this host) or expired (elsewhere); a live
    lease is a run going on; a run that ended says so in its record."""
    home = tmp_path / "home"
    store = Store(f"file://{home}")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    here = {"host": socket.gethostname(), "pid": int(gone.stdout), "expires": time.time() + 600}
    stored_run(store, "done", "FINISHED", ["sft_data", "sft"])
    stored_run(store, "stopped", "FAILED", ["sft_data"])
    stored_run(store, "killed-here", None, ["sft_data"], lease=here)
    stored_run(store, "killed-there", None, [], lease={"host": "elsewhere", "pid": 1, "expires": time.time() - 5})
    stored_run(store, "going", None, ["sft_data"], lease={"host": "elsewhere", "pid": 1, "expires": time.time() + 600})
    listing = cascade(home, "status")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout == (
        "┏━━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓\n"
        "┃ run id       ┃ state    ┃ stages                            ┃\n"
        "┡━━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩\n"
        "│ done         │ finished │ sft_data:completed, sft:completed │\n"
        "│ going        │ running  │ sft_data:completed                │\n"
        "│ killed-here  │ killed   │ sft_data:completed                │\n"
        "│ killed-there │ killed   │ (none recorded)                   │\n"
        "│ stopped      │ failed   │ sft_data:completed                │\n"
        "└──────────────┴──────────┴───────────────────────────────────┘\n"
    )
    states = {row["run_id"]: row["state"] for row in json.loads(cascade(home, "status", "--json").stdout)}
    assert states == {
        "done": "finished",
        "going": "running",
        "killed-here": "killed",
        "killed-there": "killed",
        "stopped": "failed",
    }


def test_a_run_with_no_evals_yet_says_so_in_one_line(tmp_path):
    """Not an empty matrix whose title wrapped over five lines."""
    home = tmp_path / "home"
    stored_run(Store(f"file://{home}"), "fresh", "FINISHED", ["sft_data"])
    shown = cascade(home, "status", "fresh")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (
        "finished\n"
        "                          run fresh                           \n"
        "┏━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━┓\n"
        "┃ stage      ┃ kind       ┃ status    ┃ seconds ┃ checkpoint ┃\n"
        "┡━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━┩\n"
        "│ sft_data   │ sft_data   │ completed │ 1.5     │            │\n"
        "│ sft        │ sft        │ pending   │         │            │\n"
        "│ difficulty │ difficulty │ pending   │         │            │\n"
        "│ if_rl      │ grpo       │ pending   │         │            │\n"
        "│ math_rl    │ grpo       │ pending   │         │            │\n"
        "└────────────┴────────────┴───────────┴─────────┴────────────┘\n"
        "forgetting matrix (fresh): no evals yet\n"
    )


def test_a_matrix_of_few_columns_keeps_its_title_on_one_line(capsys):
    from cascade.flows.cli.inspection import print_matrix

    report = RunReport(run_id="narrow", recipe="micro")
    report.record_eval("sft", {"math": 0.25})
    print_matrix(report)
    assert capsys.readouterr().out.splitlines() == [
        "Forgetting matrix: eval score after each stage (narrow)",
        "┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━┓",
        "┃ after stage                      ┃             math ┃",
        "┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━┩",
        "│ sft                              │            0.250 │",
        "└──────────────────────────────────┴──────────────────┘",
    ]


def test_a_regression_eval_table_shows_scores_baselines_and_drops_to_three_decimals():
    """A baseline's score is stored as evaluated (0.30000000000000004 and the like): shown as 0.300."""
    from cascade.flows.cli.regression_commands import verdicts_table
    from cascade.stages.evals.regression import Baseline, compare

    baseline = Baseline.model_validate(
        {
            "name": "nightly",
            "domains": {
                "math": {"score": 0.1 + 0.2, "checkpoint": "sft", "uri": "file:///s/runs/r/01-sft"},
                "code": {"score": 2 / 3, "checkpoint": "sft", "uri": "file:///s/runs/r/01-sft"},
            },
        }
    )
    tolerances = {"math": 0.05, "code": 0.05, "tool": 0.05}
    rows = compare("ckpt", {"math": 0.1, "code": 0.7, "tool": 0.5}, baseline, tolerances)
    out = io.StringIO()
    Console(file=out, width=100).print(verdicts_table(rows, "nightly"))
    assert out.getvalue() == (
        "                 regression eval against baseline 'nightly'                  \n"
        "┏━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━┳━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━━━━━┓\n"
        "┃ checkpoint ┃ domain ┃ score ┃ baseline ┃ drop   ┃ tolerance ┃ verdict     ┃\n"
        "┡━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━╇━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━━━━━┩\n"
        "│ ckpt       │ code   │ 0.700 │ 0.667    │ -0.033 │ 0.05      │ ok          │\n"
        "│ ckpt       │ math   │ 0.100 │ 0.300    │ +0.200 │ 0.05      │ regressed   │\n"
        "│ ckpt       │ tool   │ 0.500 │ -        │ -      │ 0.05      │ no baseline │\n"
        "└────────────┴────────┴───────┴──────────┴────────┴───────────┴─────────────┘\n"
    )
