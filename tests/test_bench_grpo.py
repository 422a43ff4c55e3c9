"""bench/bench_grpo.py: the missing-peer error, our side's step accounting, and the profile's phase arithmetic."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from grpo_cascade_side import phase_seconds, timed_run  # noqa: E402


def test_missing_trl_venv_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "TRL_VENV": str(tmp_path / "no-venv"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_grpo.py")], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"bench_grpo: no TRL venv at {tmp_path / 'no-venv'}: build it with `bash bench/trl-venv.sh` "
        "(or run --profile, which needs only ours)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_phase_seconds_per_step_and_backward_as_the_rest_of_forward_backward():
    events = [
        SimpleNamespace(key=f"grpo.{name}", cpu_time_total=us)
        for name, us in (
            ("rollout", 3_000_000),
            ("scoring", 20_000),
            ("forward_backward", 1_000_000),
            ("logprob_forward", 400_000),
            ("optimizer", 100_000),
            ("weight_sync", 2_000),
            ("logging", 4_000),
        )
    ] + [SimpleNamespace(key="aten::mm", cpu_time_total=9_999_999)]  # not a phase
    phases = phase_seconds(SimpleNamespace(key_averages=lambda: events), steps=2)
    assert phases == pytest.approx(
        {
            "rollout": 1.5,
            "scoring": 0.01,
            "mismatch_forward": 0.0,
            "logprob_forward": 0.2,
            "backward": 0.3,
            "optimizer": 0.05,
            "weight_sync": 0.001,
            "logging": 0.002,
        },
        rel=1e-12,
    )


def test_cascade_side_times_the_steps_after_warmup(tmp_path):
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, save_hf
    from cascade.stages.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    model = build_tiny_model(
        ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), len(tokenizer), seed=0
    )
    save_hf(model, tokenizer, tmp_path / "model")
    setting = {
        "model_dir": str(tmp_path / "model"),
        "prompts": 2,
        "group": 2,
        "tokens": 4,
        "dtype": "fp32",
        "steps": 2,
        "warmup": 1,
        "threads": 1,
        "pool": 16,
        "seed": 0,
        "lr": 5e-5,
        "same_work": True,
    }
    got = timed_run(setting)
    assert len(got["step_seconds"]) == 2 and all(s > 0 for s in got["step_seconds"])
    assert len(got["tokens_sampled"]) == 2 and all(1 <= t <= 2 * 2 * 4 for t in got["tokens_sampled"])
    assert got["kept_groups"] == 1.0  # same work: every group, flat or not, takes its backward
