"""The stage driver (`python -m cascade.stages.run`): stages without Prefect or MLflow, adopting what is committed.

Its checkpoint equals the flow's: tests/flows/test_cascade.py::test_micro_cascade_runs_end_to_end."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from cascade.artifacts.store import Store
from cascade.stages.run import main
from tests.conftest import micro_recipe


def driver_args(tmp_path, *extra: str) -> list[str]:
    return [
        "micro",
        f"storage.root=file://{tmp_path}/store",
        "stages.sft.steps=2",
        "stages.sft.checkpoint_every=0",
        *extra,
    ]


def sft_weights(tmp_path) -> dict[str, torch.Tensor]:
    return load_file(tmp_path / "store/runs/driver/01-sft/model/model.safetensors")


def test_one_stage_at_a_time_adopts_the_committed_ones_and_equals_both_at_once(tmp_path, capsys):
    assert main(driver_args(tmp_path / "a", "--stage", "sft_data")) == 0
    assert main(driver_args(tmp_path / "a", "--stage", "sft", "--metrics-json", str(tmp_path / "a.json"))) == 0
    assert main(driver_args(tmp_path / "b", "--stage", "sft_data", "--stage", "sft")) == 0
    one, both = sft_weights(tmp_path / "a"), sft_weights(tmp_path / "b")
    assert one.keys() == both.keys() and all(torch.equal(one[k], both[k]) for k in one)
    summary = (tmp_path / "a.json").read_text()
    assert '"adopted": true' in summary and '"steps": 2' in summary  # sft_data adopted, sft ran its 2 steps
    assert json.loads(summary)["sft"]["metrics"]["dtype"] == "fp32"  # micro's compute.dtype, recorded by the stage
    store = Store.from_config(micro_recipe(tmp_path / "a").storage)
    assert store.exists("runs/driver/metrics/01-sft.jsonl")  # the step log the report's curves read


def test_a_profiled_run_writes_the_table_of_its_grpo_phases(tmp_path, capsys):
    """--profile: the run's ops and the GRPO step's named phases, with their times, most time first."""
    table = tmp_path / "profile.txt"
    args = driver_args(tmp_path, "stages.if_rl.steps=1", "stages.if_rl.drop_flat_groups=false", "--profile", str(table))
    assert main([*args, "--stage", "sft_data", "--stage", "sft", "--stage", "difficulty", "--stage", "if_rl"]) == 0
    rows = table.read_text().splitlines()
    phases = [r.split()[0] for r in rows if r.strip().startswith("grpo.")]
    assert {"grpo.rollout", "grpo.forward_backward", "grpo.optimizer"} <= set(phases), phases
    assert "Self CPU time total" in rows[-1] or "Self CPU time total" in rows[-2]


def test_a_stage_whose_inputs_are_not_committed_is_refused_before_anything_is_written(tmp_path, capsys):
    assert main(driver_args(tmp_path, "--stage", "sft")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: stage 'sft_data' of run 'driver' is not committed") and "\n" not in err
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, message in [
        (driver_args(tmp_path, "--stage", "nope"), "no stage named 'nope' in recipe 'micro'"),
        (["no-such-recipe"], "unknown recipe 'no-such-recipe'"),
        (driver_args(tmp_path, "--run-id", ""), "bad --run-id ''"),
        (
            driver_args(tmp_path, "stages.sft.steps=-1"),
            "stages.1.sft.steps: Input should be greater than or equal to 1",
        ),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "cascade.stages.run", *args], capture_output=True, text=True, cwd=tmp_path
        )
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
    assert not (tmp_path / "store").exists()
    # answered before torch and transformers load (5 s of imports): the stage's modules load when it runs
    probe = "import sys; from cascade.stages.run import main; print(main(sys.argv[1:]), 'torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe, *driver_args(tmp_path, "--stage", "nope")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.stdout.strip() == "2 False", result.stdout + result.stderr


def test_what_the_run_cannot_use_is_one_line_before_any_stage(tmp_path):
    """An unwritable --metrics-json (once found after every stage ran), a store that does not answer and a run id
    another process holds: one line each, exit 2, no stage run (each was a traceback)."""
    from cascade.artifacts.lease import hold_run

    (tmp_path / "taken").mkdir()
    cases = [
        (driver_args(tmp_path, "--metrics-json", str(tmp_path / "taken")), "is a directory"),
        (driver_args(tmp_path, "--metrics-json", str(tmp_path / "no/such/m.json")), "no folder"),
        (driver_args(tmp_path, "--profile", str(tmp_path / "taken")), "--profile"),
        (["micro", "storage.root=s3://bucket/x", "storage.endpoint_url=http://127.0.0.1:9"], "no credentials"),
        (["micro", "storage.root=s3://bucket/x", "storage.endpoint_url=http://127.0.0.1:9"], "cannot be reached"),
    ]
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    store = Store.from_config(micro_recipe(tmp_path).storage)
    with hold_run(store, "held"):
        cases.append((driver_args(tmp_path, "--run-id", "held"), "run 'held'"))
        for args, message in cases:
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            result = subprocess.run(
                [sys.executable, "-m", "cascade.stages.run", *args],
                capture_output=True,
                text=True,
                cwd=tmp_path,
                env={**env, **(keys if message == "cannot be reached" else {})},
            )
            assert result.returncode == 2 and message in result.stderr, result.stderr
            assert result.stderr.count("\n") == 1 and "[sft_data]" not in result.stderr, result.stderr
    assert not (tmp_path / "store/runs/driver").exists()
