"""Difficulty filter throughput (prompts/s at k rollouts each): the stage's way vs the naive way, same model.

- ours: the stage's rollout path (`stages.kinds.difficulty.run_difficulty.rollouts`): one engine call per chunk of
  prompts
  with n = k, which the HF engine serves from one prefill per prompt, then grading and keep/drop;
- naive, per prompt: the issue's naive way, each prompt's k samples as k separate engine calls of n = 1;
- naive, batched: k separate engine calls of n = 1, each over every prompt of the chunk (a stronger baseline:
  it still batches across prompts, and only re-prefills each prompt k times and decodes in k smaller batches).

Both start from an empty rollout cache (a fresh store each), sample the same prompts with the same max tokens,
and grade with the domain's grader. A third row re-runs ours on the warm cache.

Run: OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/bench_difficulty.py [--model DIR|smollm2-135m]
     [--domain instruct] [--prompts 32] [--k 8] [--batch-size 128] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from cascade.artifacts.store import Store
from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import Completion, SamplingParams
from cascade.stages.kinds.difficulty.run_difficulty import Reference, keep_or_drop, rollouts
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.model import initial_model
from cascade.stages.train.rollout import prompt_pool, score_texts


class KSeparateCalls:
    """n samples of each prompt as n engine calls of n = 1, each with its own seed; per prompt, or over all."""

    name = "hf-naive"

    def __init__(self, engine: HFEngine, per_prompt: bool):
        self.engine, self.per_prompt = engine, per_prompt

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        if self.per_prompt:
            return [self._k_calls([p], n, sampling)[0] for p in prompts]
        return self._k_calls(prompts, n, sampling)

    def _k_calls(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        calls = [self.engine.generate(prompts, 1, replace(sampling, seed=(sampling.seed or 0) + j)) for j in range(n)]
        return [[call[i][0] for call in calls] for i in range(len(prompts))]

    def close(self) -> None:
        pass


def run_filter(engine, tok, recipe, store_dir: Path, items, digest: str) -> tuple[float, dict[str, int]]:
    store = Store(f"file://{store_dir}")
    ctx = StageContext(recipe, store, "bench", "runs/bench/00-difficulty", ListSink(), workdir=store_dir)
    cfg = recipe.stages[0]
    t0 = time.perf_counter()
    texts, hits = rollouts(cfg, ctx, Reference(engine, tok, digest), items, seed=0)
    solved = (score_texts(recipe, items, texts) >= 1.0).sum(dim=1).tolist()
    decisions = keep_or_drop(solved, cfg.solved_threshold, cfg.unsolved, cfg.unsolved_fraction, seed=0)
    seconds = time.perf_counter() - t0
    return seconds, {
        "kept": decisions.count("kept"),
        "cache_hits": hits,
        "chars": sum(len(t) for group in texts for t in group),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", help="'tiny' (random, tiny.yaml's shape), an HF dir, or smollm2-135m")
    ap.add_argument("--domain", default="instruct")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=128, help="engine rows per forward (engine.batch_size)")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="tiny.yaml's instruct setting")
    args = ap.parse_args()

    model, tok = initial_model(ModelConfig(source=args.model), seed=0)
    spec = {"train_size": args.prompts, "max_new_tokens": args.max_new_tokens}
    recipe = validate_recipe(
        {
            "domains": {args.domain: spec},
            "stages": [{"kind": "difficulty", "reference": "./bench", "domains": [args.domain], "k": args.k}],
        }
    )
    items = prompt_pool(recipe, [args.domain])
    ours = HFEngine(model, tok, batch_size=args.batch_size, seed=0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, engine, store in [
            ("naive, per prompt: k calls of n=1", KSeparateCalls(ours, True), "naive1"),
            ("naive, batched: k calls of n=1 over all prompts", KSeparateCalls(ours, False), "naive2"),
            ("ours: one call of n=k, shared prefill", ours, "ours"),
            ("ours, warm rollout cache", ours, "ours"),
        ]:
            seconds, stats = run_filter(engine, tok, recipe, Path(tmp) / store, items, "bench")
            rows.append((label, seconds, stats))

    per_prompt, batched = rows[0][1], rows[1][1]
    print(
        f"\nmodel {args.model}, domain {args.domain}, {len(items)} prompts x k={args.k}, "
        f"engine batch {args.batch_size} rows, max_new_tokens {args.max_new_tokens}\n"
    )
    print("| way | seconds | prompts/s | vs naive per prompt | vs naive batched | kept | cache hits | response chars |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, seconds, stats in rows:
        print(
            f"| {label} | {seconds:.2f} | {len(items) / seconds:.2f} | {per_prompt / seconds:.2f}x | "
            f"{batched / seconds:.2f}x | {stats['kept']} | {stats['cache_hits']} | {stats['chars']} |"
        )


if __name__ == "__main__":
    main()
