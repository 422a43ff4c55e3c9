"""Reward-model step speed: a pair's two answers in one row, the prompt run once, vs each answer its own row.

    PYTHONPATH=. .venv/bin/python bench/bench_reward_model.py --policy RUN_DIR/01-sft/model [--pairs-from 1200
        --batch 32 --steps 10 --rounds 3]

The pairs are the reward-model stage's own: the policy's 4 answers to chat train prompts, best-graded over worst
(`labelled_pairs`), as tiny-paper's `on_policy` pairs. The classifier is the policy's backbone with a fresh
score head (`load_reward_model`). Each timed round runs `--steps` optimizer steps of `--batch` pairs (Bradley-Terry
loss, forward + backward + AdamW at lr 0, so both layouts see the same weights) under the host's
`compute.dtype: auto` autocast, the two layouts alternating, and the table gives steps/s per round and the median.
"One row per answer" is how the stage scored pairs before: 2K right-padded rows through `sequence_scores`, which
RLHF's reward still uses for single rollouts.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from cascade.stages.domains import get_domain  # noqa: E402
from cascade.stages.engines.hf import HFEngine  # noqa: E402
from cascade.stages.engines.interface import SamplingParams  # noqa: E402
from cascade.stages.kinds.reward_model.run_reward_model import encode_pairs, labelled_pairs, pair_scores  # noqa: E402
from cascade.stages.products import load_reward_model, sequence_scores  # noqa: E402
from cascade.stages.train.losses import bradley_terry_loss  # noqa: E402
from cascade.stages.train.model import load_hf  # noqa: E402
from cascade.stages.train.precision import cpu_dtype  # noqa: E402


def one_row_per_answer(model, pairs, pad):
    scores = sequence_scores(model, [c for c, _ in pairs] + [r for _, r in pairs], pad)
    return scores[: len(pairs)], scores[len(pairs) :]


def timed_steps(model, optimizer, score, batches, pad, dtype) -> float:
    start = time.perf_counter()
    for batch in batches:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            chosen, rejected = score(model, batch, pad)
        bradley_terry_loss(chosen, rejected, len(batch), 0.0).backward()
        optimizer.step()
        optimizer.zero_grad()
    return len(batches) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", required=True, type=Path, help="an HF causal-LM dir (an SFT checkpoint's model/)")
    parser.add_argument("--pairs-from", type=int, default=1200, help="chat train prompts to sample pairs from")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per timed round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    policy, tokenizer = load_hf(args.policy)
    chat = get_domain("chat")
    pairs = labelled_pairs(
        chat,
        HFEngine(policy, tokenizer, batch_size=512, seed=0),
        tokenizer,
        chat.generate("train", args.pairs_from, 0),
        4,
        SamplingParams(max_new_tokens=24, seed=0),
    )
    encoded = encode_pairs(tokenizer, pairs)
    random.Random(0).shuffle(encoded)
    needed = args.batch * args.steps * args.rounds
    if len(encoded) < needed:
        parser.error(f"{len(encoded)} pairs from {args.pairs_from} prompts, {needed} needed: raise --pairs-from")
    model, _ = load_reward_model(args.policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    dtype = torch.bfloat16 if cpu_dtype() == "bf16" else torch.float32
    pad = tokenizer.pad_token_id
    layouts = {"one row per pair (prompt once)": pair_scores, "one row per answer": one_row_per_answer}
    rates: dict[str, list[float]] = {name: [] for name in layouts}
    for score in layouts.values():  # warm-up, untimed: the first forward pays one-off costs
        timed_steps(model, optimizer, score, [encoded[: args.batch]], pad, dtype)
    for r in range(args.rounds):
        batches = [encoded[(r * args.steps + s) * args.batch :][: args.batch] for s in range(args.steps)]
        for name, score in layouts.items():
            rates[name].append(timed_steps(model, optimizer, score, batches, pad, dtype))
    base = statistics.median(rates["one row per answer"])
    print(
        f"reward model on {args.policy}: {len(encoded)} pairs, batch {args.batch}, {args.steps} steps a round, "
        f"dtype {str(dtype).removeprefix('torch.')}, torch threads {torch.get_num_threads()}, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    print("| layout | steps/s per round | median | vs one row per answer |\n|---|---|---|---|")
    for name, values in rates.items():
        median = statistics.median(values)
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {median:.2f} | {median / base:.2f}x |")


if __name__ == "__main__":
    main()
