"""A damaged checkpoint outside a run: `cascade verify RUN` hashes every file of every checkpoint against its
manifest (a line per damaged one, exit 1), `cascade status` marks a stage whose manifest is torn, and `cascade eval`
of a checkpoint with a flipped byte is one line, exit 2."""

import os
import subprocess
import sys

import pytest

from cascade.stages.run import main as drive
from tests.conftest import micro_recipe

pytestmark = pytest.mark.slow


def cascade(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # one table row per line
    return subprocess.run(
        [sys.executable, "-m", "cascade.flows.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture
def run(tmp_path):
    """micro's SFT data and 2 SFT steps (a step checkpoint after each) through the stage driver, with the run's
    recipe.json as the flow writes it, so `status` reads the run."""
    overrides = [
        f"storage.root=file://{tmp_path}/store",
        "stages.sft.steps=3",
        "stages.sft.checkpoint_every=1",
        "stages.sft.keep_step_checkpoints=5",
    ]
    assert drive(["micro", *overrides, "--stage", "sft_data", "--stage", "sft", "--run-id", "v"]) == 0
    recipe = micro_recipe(tmp_path, *overrides)
    (tmp_path / "store/runs/v/recipe.json").write_text(recipe.model_dump_json())
    return tmp_path / "store"


def test_verify_status_and_eval_find_a_damaged_checkpoint(run):
    store = f"file://{run}"
    clean = cascade("verify", "v", "--store", store)
    assert clean.returncode == 0 and "every checkpoint verifies" in clean.stdout, clean.stderr
    weights = run / "runs/v/01-sft/model/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 1  # one flipped bit: the size is right, only the hash can tell
    weights.write_bytes(bytes(data))
    manifest = run / "runs/v/00-sft_data/MANIFEST.json"
    manifest.write_text(manifest.read_text()[:40])  # torn
    step = run / "runs/v/01-sft/steps/2/state/trainer.pt"
    step.write_bytes(step.read_bytes()[:-1])  # a step checkpoint one byte short

    damaged = cascade("verify", "v", "--store", store)
    lines = damaged.stderr.strip().splitlines()
    assert damaged.returncode == 1 and len(lines) == 3, damaged.stderr
    assert any("01-sft:" in line and "model/model.safetensors: sha256 does not match" in line for line in lines)
    assert any("00-sft_data:" in line for line in lines) and any("01-sft/steps/2:" in line for line in lines)

    table = cascade("status", "v", "--store", store)
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if line.startswith("│ sft")}
    assert table.returncode == 0 and "damaged:" in rows["sft_data"]  # its manifest is torn
    assert "damaged" not in rows["sft"]  # a flipped bit keeps every size: status lists, verify hashes

    evaluated = cascade("eval", f"{store}/runs/v/01-sft", "--recipe", "micro")
    assert evaluated.returncode == 2 and evaluated.stderr.count("\n") == 1, evaluated.stderr
    assert "does not match its sha256" in evaluated.stderr


def test_verify_of_an_unknown_run_is_one_line_exit_2(tmp_path):
    result = cascade("verify", "nope", "--store", f"file://{tmp_path}")
    assert result.returncode == 2 and result.stderr.startswith("cascade: error: unknown run id 'nope'")
