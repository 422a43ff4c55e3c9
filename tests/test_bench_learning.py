"""bench/bench_learning.py: the paired gains and verdict on hand-made item scores, the table, the mapping of our GRPO
stage onto TRL's GRPOConfig, and the stages it refuses. None of it needs .venv-trl."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_learning import grpo_stage, parse_args, stage_settings, trl_config_kwargs, unsupported  # noqa: E402
from learning_table import PARITY, SHORTFALL, render, summarize  # noqa: E402

from cascade.stages.kinds.grpo import GRPOConfig  # noqa: E402
from cascade.stages.recipe.schema import load_recipe  # noqa: E402

SFT = {"a": 0.0, "b": 0.25, "c": 0.5, "d": 0.0}
GAINS = {"a": 0.5, "b": 0.25, "c": 0.75, "d": 0.25}  # SFT + (0.5, 0, 0.25, 0.25): mean 0.25
SMALLER = {"a": 0.25, "b": 0.5, "c": 0.5, "d": 0.0}  # SFT + (0.25, 0.25, 0, 0): mean 0.125


def sides(ours: dict, trl: dict) -> dict:
    greedy = {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.0}
    return {
        "sft": {"scores": {"math": SFT, "greedy/math": greedy}},
        "ours": {
            "steps": 3,
            "seconds": 12.34,
            "reward": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
            "scores": {"math": ours, "greedy/math": {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}},
        },
        "trl": {"steps": 3, "seconds": 5.0, "reward": [0.2, 0.2], "scores": {"math": trl, "greedy/math": greedy}},
    }


def test_gains_are_paired_over_items_with_their_standard_errors():
    summary = summarize(sides(GAINS, SMALLER), "math")
    ours, trl = summary["sides"]["ours"], summary["sides"]["trl"]
    assert summary["sides"]["sft"]["mean"] == pytest.approx({"math": 0.1875, "greedy/math": 0.5})
    assert summary["sides"]["sft"]["gain"] == {}
    # ours - sft: 0.5, 0, 0.25, 0.25; deviations from 0.25: squares sum to 0.125; SE = sqrt(0.125 / 3 / 4)
    assert ours["gain"]["math"] == pytest.approx((0.25, math.sqrt(0.125 / 12)))
    # trl - sft: 0.25, 0.25, 0, 0; squares of deviations from 0.125 sum to 0.0625
    assert trl["gain"]["math"] == pytest.approx((0.125, math.sqrt(0.0625 / 12)))
    assert ours["gain"]["greedy/math"] == pytest.approx((0.25, 0.25))  # one item of four moved by 1
    assert trl["gain"]["greedy/math"] == (0.0, 0.0)
    # ours - trl: 0.25, -0.25, 0.25, 0.25; squares of deviations from 0.125 sum to 0.1875; SE = sqrt(0.1875 / 12)
    assert summary["ours_minus_trl"] == pytest.approx((0.125, 0.125))
    assert summary["verdict"] == PARITY


def test_parity_holds_down_to_one_se_below_trl_and_fails_past_it():
    at_one_se = summarize(sides(SMALLER, GAINS), "math")  # the same pair reversed: -0.125 +- 0.125
    assert at_one_se["ours_minus_trl"] == pytest.approx((-0.125, 0.125))
    assert at_one_se["verdict"] == PARITY
    no_gain = summarize(sides(SFT, SMALLER), "math")  # TRL gains, ours does not: -0.125 +- 0.072
    assert no_gain["ours_minus_trl"] == pytest.approx((-0.125, math.sqrt(0.0625 / 12)))
    assert no_gain["verdict"] == SHORTFALL
    same = summarize(sides(SMALLER, SMALLER), "math")  # no item differs: no SE, and 0 is not below 0
    assert same["ours_minus_trl"] == (0.0, 0.0) and same["verdict"] == PARITY


def test_table_rows_and_verdict_line():
    given = sides(GAINS, SMALLER)
    lines = render(given, summarize(given, "math")).splitlines()
    assert lines[0] == (
        "| side | steps | seconds | reward first 5 | reward last 5 | math | gain vs SFT | greedy/math | greedy gain |"
    )
    assert lines[2] == "| sft | - | - | - | - | 0.188 | - | 0.500 | - |"
    # rewards: the first five average 0.3, the last five 0.5; 0.25 / 0.1021 = 2.45 SE
    assert lines[3] == (
        "| ours | 3 | 12.3 | 0.300 | 0.500 | 0.438 | +0.250 ± 0.102 (+2.4 SE) | 0.750 | +0.250 ± 0.250 (+1.0 SE) |"
    )
    assert lines[4] == "| trl | 3 | 5.0 | 0.200 | 0.200 | 0.312 | +0.125 ± 0.072 (+1.7 SE) | 0.500 | +0.000 ± 0 |"
    assert lines[5] == f"ours - TRL: +0.125 ± 0.125 (+1.0 SE): {PARITY}"
    assert len(lines) == 6


def test_our_math_stage_maps_onto_grpo_config_kwargs():
    recipe = load_recipe("tiny")
    args = parse_args(["--checkpoint", "x", "--out", "o", "--steps", "7", "--group", "4", "--lr", "1e-4"])
    cfg = GRPOConfig.model_validate(stage_settings(grpo_stage(recipe, "math", "tiny"), args))
    assert (cfg.name, cfg.steps, cfg.prompts_per_step, cfg.group_size, cfg.lr) == ("math_rl", 7, 16, 4, 1e-4)
    assert cfg.checkpoint_every == 0 and cfg.drop_flat_groups  # the recipe's stage otherwise
    assert trl_config_kwargs(
        cfg.model_copy(
            update={"adam_betas": (0.8, 0.9), "weight_decay": 0.1, "grad_clip": 0.5, "temperature": 0.7, "top_p": 0.9}
        ),
        24,
        3,
    ) == {
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": 1,
        "max_steps": 7,
        "seed": 3,
        "learning_rate": 1e-4,
        "per_device_train_batch_size": 64,
        "gradient_accumulation_steps": 1,
        "num_generations": 4,
        "steps_per_generation": 1,
        "max_completion_length": 24,
        "temperature": 0.7,
        "top_p": 0.9,
        "beta": 0.0,
        "use_vllm": False,
        "log_completions": False,
        "bf16": False,
        "dataloader_num_workers": 0,
        "gradient_checkpointing": False,
        "lr_scheduler_type": "constant",
        "optim": "adamw_torch_fused",
        "adam_beta1": 0.8,
        "adam_beta2": 0.9,
        "weight_decay": 0.1,
        "max_grad_norm": 0.5,
        "loss_type": "dapo",
        "scale_rewards": "group",
        "shuffle_dataset": False,
    }
    flat = parse_args(["--checkpoint", "x", "--out", "o", "--keep-flat-groups"])
    assert stage_settings(grpo_stage(recipe, "math", "tiny"), flat)["drop_flat_groups"] is False


def test_missing_trl_venv_is_one_line_exit_2(tmp_path):
    env = {**os.environ, "TRL_VENV": str(tmp_path / "no-venv"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_learning.py"),
            "--checkpoint",
            "x",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip().splitlines() == [
        f"bench_learning: no TRL venv at {tmp_path / 'no-venv'}: build it with `bash bench/trl-venv.sh`"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing written, --out included


def test_stages_trl_cannot_be_given_the_same_are_refused():
    recipe = load_recipe("tiny")
    assert unsupported(grpo_stage(recipe, "math", "tiny")) == []
    assert unsupported(grpo_stage(recipe, "instruct", "tiny")) == [
        "prompts from difficulty stage 'difficulty' (the bench runs no earlier stage)"
    ]
    cfg = GRPOConfig(name="rl", domains=["math"], refill_rounds=2, kl_coef=0.1, warmup_steps=5)
    assert unsupported(cfg) == [
        "refill_rounds (TRL draws no prompts beyond a step's P)",
        "kl_coef (the bench compares the KL-free objective, beta=0)",
        "warmup_steps (TRL's warm-up takes its first step at lr 0, ours at lr / warmup_steps)",
    ]
    with pytest.raises(SystemExit, match="has no GRPO stage on 'chat' alone"):
        grpo_stage(recipe, "chat", "tiny")
