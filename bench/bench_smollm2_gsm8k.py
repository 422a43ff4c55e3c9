"""recipes/smollm2-gsm8k.yaml on this CPU: SFT tokens/s and the time of one GRPO step.

Runs the recipe's own stages (sft_data on the first --rows GSM8K train rows, sft, the GRPO stage) with only sizes
overridden. Step times come from a clock read at every logged step, so model loading, the data build and
checkpoint writes are not counted: an SFT step is the time between two consecutive step logs (the first step,
which includes warm-up, is dropped), a GRPO step likewise (rollouts + rewards + update).

Run from the checkout: PYTHONPATH=. .venv/bin/python bench/bench_smollm2_gsm8k.py
    [--rows 64] [--sft-steps 4] [--sft-batch 16] [--grpo-steps 2] [--grpo-prompts 8] [--grpo-group 8]
    [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from cascade.artifacts.store import Store
from cascade.flows.recipes import load_recipe
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.kinds.sft.run_sft import run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.train.context import ListSink, StageContext


class TimedSink(ListSink):
    """A metric sink that also keeps when each step was logged."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        super().log(step, metrics)
        self.times.append(time.perf_counter())

    def step_seconds(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--sft-batch", type=int, default=16)
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--grpo-prompts", type=int, default=8)
    parser.add_argument("--grpo-group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-smollm2-"))
    recipe = load_recipe(
        "smollm2-gsm8k",
        [
            f"storage.root=file://{tmp}/store",
            "tracking.enabled=false",
            f"stages.sft_data.sources.math.shared.count={args.rows}",
            f"stages.sft.steps={args.sft_steps}",
            f"stages.sft.warmup_steps={min(20, args.sft_steps)}",  # the recipe's, cut to a shorter stage
            f"stages.sft.batch_size={args.sft_batch}",
            f"stages.sft.micro_batch_size={min(4, args.sft_batch)}",
            "stages.sft.checkpoint_every=0",
            f"stages.gsm8k_rl.steps={args.grpo_steps}",
            f"stages.gsm8k_rl.prompts_per_step={args.grpo_prompts}",
            f"stages.gsm8k_rl.group_size={args.grpo_group}",
            "stages.gsm8k_rl.checkpoint_every=0",
            f"domains.math.max_new_tokens={args.max_new_tokens}",
        ],
    )
    store = Store.from_config(recipe.storage)
    refs, sinks = {}, {}
    for index, (name, run, inputs) in enumerate(
        (
            ("sft_data", run_sft_data, lambda: StageInputs()),
            ("sft", run_sft, lambda: StageInputs(stages={"sft_data": refs["sft_data"]})),
            ("gsm8k_rl", run_grpo, lambda: StageInputs(policy=refs["sft"])),
        )
    ):
        sinks[name] = TimedSink()
        ctx = StageContext(recipe, store, "bench", f"runs/bench/{index:02d}-{name}", sinks[name], workdir=tmp)
        refs[name] = run(recipe.stage(name), ctx, inputs()).checkpoint
    sft = sinks["sft"]
    sft_s = sft.step_seconds()
    tokens = sft.series("tokens_trained")[1:]
    print(f"load average {os.getloadavg()[0]:.1f}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    cfg = recipe.stage("sft")
    print(
        f"SFT: batch {cfg.batch_size} (micro {cfg.micro_batch_size}), padded tokens per step "
        f"{sum(tokens) / len(tokens):.0f}, {sum(sft_s) / len(sft_s):.2f} s/step, "
        f"{sum(tokens) / sum(sft_s):.0f} tokens/s"
    )
    grpo = sinks["gsm8k_rl"]
    step_s = grpo.step_seconds()
    sampled = grpo.series("tokens_sampled")
    print(
        f"GRPO: {args.grpo_prompts} prompts x {args.grpo_group} samples, up to {args.max_new_tokens} new tokens: "
        f"{step_s[-1]:.1f} s for step {len(step_s) + 1} ({sampled[-1]:.0f} tokens sampled; "
        f"kept groups {grpo.series('kept_groups')[-1]:.2f})"
    )


if __name__ == "__main__":
    main()
