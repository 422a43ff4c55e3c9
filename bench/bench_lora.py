"""GRPO on smollm2-135m with and without LoRA: peak memory and step time.

    .venv/bin/python bench/bench_lora.py [--steps 4] [--rank 16] [--home DIR] [--set KEY=VALUE ...]

Runs recipes/smollm2-if.yaml's GRPO stage for --steps steps (8 prompts x 8 samples, 128 new tokens, as the recipe
trains), once training every weight and once with `lora: {rank, alpha: 2 * rank}` on every linear layer, each in
its own `cascade run` process (no evals, no tracking, no step checkpoints) in CASCADE_HOME (--home: one that
already holds the converted model, so the conversion is not timed). Prints per variant the trainable parameters,
the peak RSS of the process (from wait4), and the median rollout, update and whole-step seconds over the steps
after the first (the first carries one-time costs: the engine's first forward, the optimizer's state). --set
adds a recipe override to both variants (e.g. `engine.rollout_dtype=compute`: rollouts from a bf16 copy). Learning
is not compared here: the steps are few and the learning rate is the recipe's for both.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGE = "00-if_rl"


def run_variant(name: str, overrides: list[str], home: Path) -> dict:
    run_id = f"bench-lora-{name}"
    shutil.rmtree(home / "runs" / run_id, ignore_errors=True)
    cmd = [sys.executable, "-m", "cascade.flows.cli", "run", "smollm2-if", *overrides, "--run-id", run_id]
    started = time.perf_counter()
    with open(home / f"{run_id}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "CASCADE_HOME": str(home)}
        )
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name}: `{' '.join(cmd)}` failed; log: {home / f'{run_id}.log'}")
    steps = [json.loads(line)["metrics"] for line in (home / "runs" / run_id / "metrics" / f"{STAGE}.jsonl").open()]
    manifest = json.loads((home / "runs" / run_id / STAGE / "MANIFEST.json").read_text())
    later = steps[1:] or steps
    return {
        "variant": name,
        "trainable": manifest["metrics"].get("trainable_parameters"),
        "peak_rss_gb": usage.ru_maxrss / 2**20,  # KiB on Linux
        "rollout_s": statistics.median(s["rollout_seconds"] for s in later),
        "update_s": statistics.median(s["update_seconds"] for s in later),
        "step_s": statistics.median(s["step_seconds"] for s in later),
        "wall_s": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--home", type=Path, default=Path(os.environ.get("CASCADE_HOME", Path.home() / ".cascade")))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe override for both")
    args = parser.parse_args(argv)
    common = [
        "eval.enabled=false",
        "eval.source=false",
        "tracking.enabled=false",
        f"stages.if_rl.steps={args.steps}",
        "stages.if_rl.checkpoint_every=0",
        *args.set,
    ]
    lora = f"stages.if_rl.lora={{rank: {args.rank}, alpha: {2 * args.rank}}}"
    rows = [run_variant("full", common, args.home), run_variant(f"lora-r{args.rank}", [*common, lora], args.home)]
    settings = f", {' '.join(args.set)}" if args.set else ""
    print(f"GRPO on smollm2-135m, {args.steps} steps of 8 x 8{settings}, load average {os.getloadavg()[0]:.2f}")
    print("| variant | trainable parameters | peak RSS (GB) | rollout s | update s | step s | wall s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['variant']} | {r['trainable']:,} | {r['peak_rss_gb']:.2f} | {r['rollout_s']:.1f} | "
            f"{r['update_s']:.1f} | {r['step_s']:.1f} | {r['wall_s']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
