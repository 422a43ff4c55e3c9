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
    # tests/gpu (collected), tiny twice, model + decoders' A/B + smollm2 shape, fsdp2, report
    assert steps.count(": exit 0 in") == 8
    check = json.loads((tmp_path / "out" / "check.json").read_text())
    assert {(r["run"], r["stage"]) for r in check["rows"]} == {
        (run, stage) for run in ("tiny-main", "tiny-ref", "smollm2-135m", "fsdp2-cpu") for stage in ("sft", "math_rl")
    }
    assert all(r["step_s"] > 0 for r in check["rows"])
    curve = check["curves"]["tiny"]
    assert len(curve["main_loss"]) == 4 and curve["main_loss"][-1] < curve["main_loss"][0]  # it trained
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["check.json", "check.md", "logs.tgz", "steps.log"]


def split_file(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "bench/gpu/split_file.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_a_file_split_to_travel_joins_back_byte_for_byte_and_a_bad_part_writes_nothing(tmp_path):
    """The real model crosses to a lent GPU in parts: joined, they are the file; a part missing, cut short or
    altered is one line and exit 2, and the destination is not written."""
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(5 * (1 << 20) + 123))
    parts = tmp_path / "parts"
    made = split_file("split", str(source), str(parts), "2", "2")
    assert made.returncode == 0, made.stderr
    sizes = [(parts / f"part-0{i}").stat().st_size for i in range(3)]
    assert sizes == [2 << 20, 2 << 20, (1 << 20) + 123]
    joined = tmp_path / "out" / "model.gguf"
    assert split_file("join", str(parts), str(joined)).returncode == 0
    assert joined.read_bytes() == source.read_bytes()

    joined.unlink()
    middle = (parts / "part-01").read_bytes()
    (parts / "part-01").write_bytes(middle[:-1] + bytes([middle[-1] ^ 1]))  # one bit flipped
    bad = split_file("join", str(parts), str(joined))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "part-01" in bad.stderr
    (parts / "part-01").unlink()
    missing = split_file("join", str(parts), str(joined))
    assert missing.returncode == 2 and "part-01: missing" in missing.stderr
    assert not joined.exists() and not list(joined.parent.iterdir())


def test_the_data_root_can_be_named_by_the_environment(tmp_path):
    """A machine where the benchmark files lie elsewhere (a lent GPU) names them with CASCADE_DATA_ROOT."""
    code = "from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT as d; print(d)"
    env = {**os.environ, "CASCADE_DATA_ROOT": str(tmp_path)}
    named = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert named.stdout.strip() == str(tmp_path.resolve())
    env.pop("CASCADE_DATA_ROOT")
    default = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert default.stdout.strip() == str(ROOT.parent / "shared" / "data")
