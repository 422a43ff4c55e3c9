"""One GRPO update's forward and backward: full [prompt | completion] rows vs each prompt forwarded once.

    PYTHONPATH=. .venv/bin/python bench/bench_update.py [--model tiny|smollm2-135m|DIR] [--reps 5]

For each (prompt length, group size) of the grid, builds 8 prompts x G completions of 8-32 random tokens, and
times the loss's forward and backward two ways: `full_row_logits` (the full rows, right-padded, in one forward:
what the update did before, and its fallback now) and `shared_prefix_logits` (each prompt once, the completions
on its repeated KV cache), both from stages/train/completions.py. Both give the same loss and gradient
(tests/stages/test_training.py); the table prints the median
seconds of --reps repetitions after one warm-up, alternating the two, and the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from cascade.stages.engines.interface import Completion
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.completions import CompletionBatch, completion_batch, full_row_logits, shared_prefix_logits
from cascade.stages.train.losses import grpo_loss, token_logprobs
from cascade.stages.train.model import initial_model

PROMPTS = 8


def rollouts(vocab: int, prompt_len: int, group: int) -> list[tuple[list[int], Completion]]:
    rng = random.Random(0)
    rows = []
    for _ in range(PROMPTS):
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        for _ in range(group):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 32))]
            rows.append((prompt, Completion(comp, [0.0] * len(comp), "", "length")))
    return rows


def loss_of(logits_of, model, batch: CompletionBatch, adv: torch.Tensor, pad: int) -> torch.Tensor:
    """The GRPO loss with the logits from `logits_of`: full_row_logits or shared_prefix_logits."""
    used, repeat = torch.unique_consecutive(batch.owner, return_inverse=True)
    logits = logits_of(model, [batch.prompts[i] for i in used.tolist()], repeat, batch.ids, pad)
    logp = token_logprobs(logits, batch.ids)
    return grpo_loss(logp, logp.detach(), adv, batch.mask, int(batch.mask.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    model, tok = initial_model(ModelConfig(source=args.model), seed=0)
    model.train()
    pad = tok.pad_token_id
    print(
        f"update forward+backward on {args.model}, {PROMPTS} prompts, completions 8-32 tokens, "
        f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}"
    )
    print("| prompt tokens | G | full rows (s) | shared prompt (s) | full / shared | load |")
    print("| --- | --- | --- | --- | --- | --- |")
    for prompt_len in (20, 64):
        for group in (4, 16):
            batch = completion_batch(rollouts(len(tok), prompt_len, group), pad)
            adv = torch.randn(len(batch), generator=torch.Generator().manual_seed(0))
            times: dict[str, list[float]] = {"full": [], "shared": []}
            for rep in range(args.reps + 1):
                for name, logits_of in (("full", full_row_logits), ("shared", shared_prefix_logits))[
                    :: 1 - 2 * (rep % 2)
                ]:
                    model.zero_grad(set_to_none=True)
                    start = time.perf_counter()
                    loss_of(logits_of, model, batch, adv, pad).backward()
                    if rep:  # the first repetition is the warm-up
                        times[name].append(time.perf_counter() - start)
            full, shared = statistics.median(times["full"]), statistics.median(times["shared"])
            print(
                f"| {prompt_len} | {group} | {full:.3f} | {shared:.3f} | {full / shared:.2f}x | "
                f"{os.getloadavg()[0]:.1f} |"
            )


if __name__ == "__main__":
    main()
