"""Our side of bench/bench_grpo.py: `stages.kinds.grpo.run_grpo.run_grpo` on a one-stage recipe built from a bench
setting.

Run by bench_grpo.py as `.venv/bin/python bench/grpo_cascade_side.py '<setting JSON>'`; prints one JSON line
with the time of every timed step (the interval between consecutive step logs), the completion tokens each
sampled and the share of groups kept. `profile_step` (bench_grpo.py --profile) runs the same stage in-process
under torch.profiler and prints the share of a step each `grpo.<phase>` range takes.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from cascade.artifacts.store import Store
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.train.context import ListSink, StageContext

# top-level ranges of a step, in order; backward is forward_backward less the logprob_forward ranges inside it
PHASES = (
    "rollout",
    "scoring",
    "mismatch_forward",
    "logprob_forward",
    "backward",
    "optimizer",
    "weight_sync",
    "logging",
)


class StepClock(ListSink):
    """A metric sink that also keeps when each step was logged; `on_step(step)` runs after each log."""

    def __init__(self, on_step=None):
        super().__init__()
        self.times: list[float] = []
        self.on_step = on_step

    def log(self, step: int, metrics: dict[str, float]) -> None:
        super().log(step, metrics)
        self.times.append(time.perf_counter())
        if self.on_step is not None:
            self.on_step(step)


def run_stage(setting: dict, sink: ListSink, workdir: Path) -> None:
    recipe = validate_recipe(
        {
            "seed": setting["seed"],
            "storage": {"root": f"file://{workdir}/store"},
            "model": {"source": setting["model_dir"]},
            "compute": {"dtype": setting["dtype"], "device": "cpu"},
            "domains": {
                "math": {"train_size": setting["pool"], "heldout_size": 16, "max_new_tokens": setting["tokens"]}
            },
            "stages": [
                {
                    "kind": "grpo",
                    "name": "rl",
                    "domains": ["math"],
                    "steps": setting["warmup"] + setting["steps"],
                    "prompts_per_step": setting["prompts"],
                    "group_size": setting["group"],
                    # one forward/backward over the whole batch, as TRL's per_device_train_batch_size = P x G
                    "micro_batch_size": setting["prompts"] * setting["group"],
                    "lr": setting["lr"],
                    "checkpoint_every": 0,
                    "drop_flat_groups": not setting["same_work"],
                    **(
                        {"lora": {"rank": setting["lora_rank"], "alpha": 2 * setting["lora_rank"]}}
                        if setting.get("lora_rank")
                        else {}
                    ),
                }
            ],
        },
        "bench_grpo",
    )
    ctx = StageContext(recipe, Store.from_config(recipe.storage), "bench", "runs/bench/00-rl", sink, workdir=workdir)
    run_grpo(recipe.stage("rl"), ctx, StageInputs())


def timed_run(setting: dict) -> dict:
    torch.set_num_threads(setting["threads"])
    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="bench-grpo-ours-") as tmp:
        run_stage(setting, clock, Path(tmp))
    warm = setting["warmup"]
    step_seconds = [b - a for a, b in zip(clock.times, clock.times[1:])][warm - 1 :]  # steps warmup+1..S
    return {
        "step_seconds": step_seconds,
        "tokens_sampled": clock.series("tokens_sampled")[warm:],
        "kept_groups": sum(clock.series("kept_groups")[warm:]) / setting["steps"],
    }


def phase_seconds(prof: torch.profiler.profile, steps: int) -> dict[str, float]:
    """Seconds per step of each grpo.<phase> range (CPU wall time of the range, children included)."""
    totals = {
        e.key.removeprefix("grpo."): e.cpu_time_total / 1e6 / steps
        for e in prof.key_averages()
        if e.key.startswith("grpo.")
    }
    per_step = {phase: totals.get(phase, 0.0) for phase in PHASES}
    per_step["backward"] = totals.get("forward_backward", 0.0) - per_step["logprob_forward"]
    return per_step


def profile_step(setting, label: str) -> dict[str, float]:
    """Profiles the timed steps (after setting.warmup) and prints each phase's seconds and share per step."""
    cfg = dict(setting.__dict__)
    torch.set_num_threads(cfg["threads"])
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    clock = StepClock(on_step=lambda step: prof.start() if step == cfg["warmup"] else None)
    with tempfile.TemporaryDirectory(prefix="bench-grpo-profile-") as tmp:
        try:
            run_stage(cfg, clock, Path(tmp))  # the final checkpoint write is profiled, but is in no range
        finally:
            prof.stop()
    step = (clock.times[-1] - clock.times[cfg["warmup"] - 1]) / cfg["steps"]
    phases = phase_seconds(prof, cfg["steps"])
    phases["other"] = step - sum(phases.values())
    label += " same work" if cfg["same_work"] else " as configured"
    print(
        f"[{label}] one GRPO step under torch.profiler: {step:.3f} s (mean of {cfg['steps']}), kept groups "
        f"{sum(clock.series('kept_groups')[cfg['warmup'] :]) / cfg['steps']:.2f}"
    )
    print(f"  {'phase':<18} {'s/step':>8} {'share':>6}")
    for phase, seconds in phases.items():
        print(f"  {phase:<18} {seconds:>8.4f} {seconds / step:>6.1%}", flush=True)
    return phases


if __name__ == "__main__":
    print(json.dumps(timed_run(json.loads(sys.argv[1]))))
