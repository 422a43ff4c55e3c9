"""bench/gpu/check.sh --dry-run: every CPU-side part of the GPU check, small, on the CPU, so a lent GPU's minutes
are not spent finding a broken script. One model shape (the 0.5B one costs a minute more on 2 cores)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.long
@pytest.mark.slow
def test_the_gpu_checks_dry_run_drives_every_part_and_reports(tmp_path):
    store = tmp_path / "carried"
    env = {**os.environ, "PYTHON": sys.executable, "SHAPES": "smollm2-135m", "TMPDIR": str(tmp_path)}
    prepared = subprocess.run(
        [
            sys.executable,
            "-m",
            "cascade.stages.run",
            "bench/gpu/tiny-gpu.yaml",
            f"storage.root=file://{store}",
            "--run-id",
            "prep",
            "--stage",
            "sft_data",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert prepared.returncode == 0, prepared.stderr
    env["GPU_CHECK_STORE"] = str(store)
    result = subprocess.run(
        ["bash", "bench/gpu/check.sh", "--dry-run", "--out", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    steps = (tmp_path / "out" / "steps.log").read_text()
    assert result.returncode == 0, steps + result.stdout[-2000:]
    assert steps.count(": exit 0 in") == 7  # tests/gpu (collected), tiny twice, model + smollm2 shape, fsdp2, report
    check = json.loads((tmp_path / "out" / "check.json").read_text())
    assert {(r["run"], r["stage"]) for r in check["rows"]} == {
        (run, stage) for run in ("tiny-main", "tiny-ref", "smollm2-135m", "fsdp2-cpu") for stage in ("sft", "math_rl")
    }
    assert all(r["step_s"] > 0 for r in check["rows"])
    curve = check["curves"]["tiny"]
    assert len(curve["main_loss"]) == 4 and curve["main_loss"][-1] < curve["main_loss"][0]  # it trained
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["check.json", "check.md", "logs.tgz", "steps.log"]
