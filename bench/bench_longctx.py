"""A long-context GRPO stage against a short-context one: prompt length, s/step and peak memory.

Both stages run the same GRPO step (tiny model, same prompts per step, group size and new tokens) on their own
domain: `short` on math, `long` on longctx with a haystack set from the recipe (`domains.longctx.options`), with
the model's window stretched by YaRN so positions past 1024 are interpolated, not extrapolated. Each stage runs in
a fresh process (peak RSS only grows) and reports the mean prompt length in tokens, the median seconds per step
after the first (warm-up) step, and the peak RSS. Load: run it on idle cores and say what else ran.

Run: .venv/bin/python bench/bench_longctx.py [--steps 4] [--filler 300] [--keys 24]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, statistics, sys, tempfile, time
from cascade.artifacts.store import Store
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.kinds import StageInputs
from cascade.stages.train.model import prompt_ids
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.train.tokenizer import load_tokenizer

domain, steps, keys, filler = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tmp = tempfile.mkdtemp()
spec = {"train_size": 200, "heldout_size": 4, "max_new_tokens": 16}
if domain == "longctx":
    spec["options"] = {"num_keys": keys, "num_filler": filler}
recipe = validate_recipe({
    "storage": {"root": f"file://{tmp}/store"},
    "model": {"max_position_embeddings": 8192,
              "rope_scaling": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024}},
    "domains": {domain: spec},
    "stages": [{"kind": "grpo", "name": "rl", "domains": [domain], "steps": steps, "prompts_per_step": 8,
                "group_size": 4, "checkpoint_every": 0}],
})
tok = load_tokenizer()
items = recipe.domain(domain).generate("train", 50, 0)
prompt_tokens = sum(len(prompt_ids(tok, it.prompt)) for it in items) / len(items)
times = []
class TimedSink(ListSink):  # a step ends when its metrics are logged
    def log(self, step, metrics):
        times.append(time.perf_counter())
ctx = StageContext(recipe, Store.from_config(recipe.storage), "bench", "runs/bench/00-rl", TimedSink(), workdir=tmp)
run_grpo(recipe.stage("rl"), ctx, StageInputs())
per_step = [b - a for a, b in zip(times, times[1:])]
print(json.dumps({"domain": domain, "prompt_tokens": round(prompt_tokens),
                  "s_per_step": round(statistics.median(per_step), 2),
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))
"""


def measure(domain: str, steps: int, keys: int, filler: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, domain, str(steps), str(keys), str(filler)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--keys", type=int, default=24)
    ap.add_argument("--filler", type=int, default=300)
    args = ap.parse_args()
    rows = [measure("math", args.steps, args.keys, args.filler), measure("longctx", args.steps, args.keys, args.filler)]
    print(f"GRPO, tiny model (YaRN x8 window), 8 prompts x 4 samples x 16 new tokens; load {os.getloadavg()[0]:.2f}")
    print("| stage | domain | prompt tokens (mean) | s/step (median) | peak RSS (MB) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, r in zip(("short", "long"), rows):
        print(f"| {name} | {r['domain']} | {r['prompt_tokens']} | {r['s_per_step']} | {r['peak_rss_mb']} |")
    print(
        f"long/short: {rows[1]['prompt_tokens'] / rows[0]['prompt_tokens']:.1f}x the tokens, "
        f"{rows[1]['s_per_step'] / rows[0]['s_per_step']:.1f}x the step time, "
        f"{rows[1]['peak_rss_mb'] / rows[0]['peak_rss_mb']:.2f}x the peak memory"
    )


if __name__ == "__main__":
    main()
