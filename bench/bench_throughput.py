"""Throughput of a model on this CPU: SFT step and rollout generation, beside their plain-HF peers. The tiny model
by default; `--model smollm2-135m` measures the real one on the uniform rows and a GRPO-shaped rollout (8 prompts x
8 samples x 128 tokens) only. `cascade plan`'s cpu profile is built from both models' rows (stages/recipe/plan.py).

Prints one table:
- matmul peak (fp32 and bf16, 2048x2048) measured here, the ceiling the others are read against;
- SFT step tokens/s (ours: `--dtype` bf16 autocast or fp32, token-normalized loss) vs a naive HF step (fp32,
  `labels=`), and the fraction of the matmul peak reached, counting 6 * N_params * tokens FLOPs: on uniform
  B32 x T128 rows, and on a length-skewed mix, ours packed and padded (the SFT stage's `packing`);
- rollout tokens/s: our HF engine (KV cache, left padding, per-token logprobs) vs HF `generate`.

Run: .venv/bin/python bench/bench_throughput.py [--steps 20] [--dtype bf16|fp32] [--sft-only] [--model smollm2-135m]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from contextlib import nullcontext

import torch

from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.kinds.sft.run_sft import model_rows
from cascade.stages.recipe.config_base import OptimizerConfig
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.losses import sft_loss, token_logprobs
from cascade.stages.train.model import build_tiny_model, num_parameters, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer
from cascade.stages.train.training import make_optimizer


def autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def tiny(tok) -> torch.nn.Module:
    return build_tiny_model(ModelConfig(), len(tok), seed=0)


def smollm2() -> tuple[torch.nn.Module, object]:
    from cascade.stages.train.model import load_hf
    from cascade.stages.train.model_source import smollm2_dir

    return load_hf(smollm2_dir())


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def sft_step_tps(
    model, rows: list[tuple[list[int], list[tuple[int, int]]]], steps: int, bf16: bool, layout: str, pad: int = 0
) -> float:
    """Trained tokens/s (the rows' own tokens, never padding) of SFT steps on one batch of rows. layout: "packed"
    or "padded" (ours: model_rows, token-normalized loss, fused AdamW) or "naive" (padded, HF `labels=` with -100
    on prompt and padding, an attention mask, the same fused AdamW as ours)."""
    opt = make_optimizer(model, 1e-4, OptimizerConfig())
    ids, mask, positions = model_rows(rows, pad, packing=layout == "packed", pack_length=None)
    num_tokens = int(mask[:, 1:].sum())
    labels = ids.masked_fill(mask == 0, -100)  # HF shifts labels by one itself
    attention = torch.arange(ids.shape[1]) < torch.tensor([len(r) for r, _ in rows])[:, None]
    for i in range(steps + 3):
        if i == 3:
            t0 = time.perf_counter()
        with autocast(bf16):
            if layout == "naive":
                loss = model(input_ids=ids, attention_mask=attention.long(), labels=labels).loss
            else:
                logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1]
                loss = sft_loss(token_logprobs(logits, ids[:, 1:]), mask[:, 1:], num_tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * sum(len(r) for r, _ in rows) / (time.perf_counter() - t0)


def uniform_rows(vocab: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """B32 x T128 random tokens, every token but the first trained: no padding, nothing for packing to remove."""
    ids = torch.randint(3, vocab, (32, 128), generator=torch.Generator().manual_seed(0))
    return [(row.tolist(), [(1, 128)]) for row in ids]


def skewed_rows(vocab: int) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """32 rows, length-skewed like tiny-paper's mix (short math/instruct rows beside a few long SWE and
    long-context ones): 24 of 32-96 tokens, 8 of 256-512; the prompt is the first 40-60% of each row."""
    rng = random.Random(0)
    rows = []
    for i in range(32):
        length = rng.randint(256, 512) if i % 4 == 0 else rng.randint(32, 96)
        prompt = int(length * rng.uniform(0.4, 0.6))
        rows.append(([rng.randrange(3, vocab) for _ in range(length)], [(prompt, length)]))
    return rows


def generate_tps(model, tok, prompts: list[list[int]], n: int, new_tokens: int) -> tuple[float, float]:
    engine = HFEngine(model, tok, batch_size=len(prompts) * n, seed=0)
    t0 = time.perf_counter()
    out = engine.generate(prompts, n, SamplingParams(max_new_tokens=new_tokens, seed=0))
    ours = sum(len(c.token_ids) for g in out for c in g) / (time.perf_counter() - t0)
    ids = torch.tensor([p for p in prompts])
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=new_tokens,
            num_return_sequences=n,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    peer = (gen.shape[1] - ids.shape[1]) * gen.shape[0] / (time.perf_counter() - t0)
    return ours, peer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="our SFT step's compute.dtype")
    parser.add_argument("--sft-only", action="store_true", help="skip the rollout rows")
    parser.add_argument("--model", choices=["tiny", "smollm2-135m"], default="tiny")
    args = parser.parse_args()
    load_before = os.getloadavg()
    torch.manual_seed(0)
    real = args.model != "tiny"
    if real:
        model, tok = smollm2()
        fresh = lambda: smollm2()[0]  # noqa: E731
    else:
        tok = load_tokenizer()
        model = tiny(tok)
        fresh = lambda: tiny(tok)  # noqa: E731
    pad, n_params = tok.pad_token_id or 0, num_parameters(model)
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    bf16, dtype = args.dtype == "bf16", args.dtype
    peak = peak16 if bf16 else peak32
    uniform = uniform_rows(len(tok))
    ours = sft_step_tps(model, uniform, args.steps, bf16, layout="padded", pad=pad)
    naive = sft_step_tps(fresh(), uniform, args.steps, bf16=False, layout="naive", pad=pad)
    rows = [
        ("matmul peak fp32 / bf16", f"{peak32 / 1e9:.0f} / {peak16 / 1e9:.0f} GFLOP/s", ""),
        (
            f"SFT step, B32 x T128 (ours, {dtype})",
            f"{ours:,.0f} tok/s",
            f"{6 * n_params * ours / peak:.0%} of {dtype} peak; {ours / naive:.2f}x naive",
        ),
        ("SFT step, naive HF fp32 (peer)", f"{naive:,.0f} tok/s", f"{6 * n_params * naive / peak32:.0%} of fp32 peak"),
    ]
    if not real:
        rows += skewed_mix_rows(tok, args.steps, bf16, dtype)
    if not args.sft_only:
        count, n, new = (8, 8, 128) if real else (64, 8, 64)
        prompts = [prompt_ids(tok, f"Compute {i % 10}+{(i * 7) % 10}-{(i * 3) % 10}.") for i in range(count)]
        gen_ours, gen_peer = generate_tps(model.eval(), tok, prompts, n=n, new_tokens=new)
        shape = f"{count} x {n} x {new}"
        rows += [
            (f"rollout {shape} (ours, HFEngine, fp32)", f"{gen_ours:,.0f} new tok/s", "with per-token logprobs"),
            (f"rollout {shape} (HF generate, peer)", f"{gen_peer:,.0f} new tok/s", "no logprobs"),
        ]
    print(
        f"{args.model}: {n_params / 1e6:.2f}M parameters, torch {torch.__version__}, {torch.get_num_threads()} "
        f"threads, load average before / after: {load_before} / {os.getloadavg()}"
    )
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>22}  {note}")


def skewed_mix_rows(tok, steps: int, bf16: bool, dtype: str) -> list[tuple[str, str, str]]:
    """The length-skewed mix, packed and padded (ours) and naive (the peer), on fresh tiny models."""
    skewed = skewed_rows(len(tok))
    mix = {layout: sft_step_tps(tiny(tok), skewed, steps, bf16, layout) for layout in ("packed", "padded")}
    mix_naive = sft_step_tps(tiny(tok), skewed, steps, bf16=False, layout="naive")
    shapes = {layout: tuple(model_rows(skewed, 0, layout == "packed", None)[0].shape) for layout in mix}
    return [
        (
            f"SFT skewed mix, packed (ours, {dtype})",
            f"{mix['packed']:,.0f} tok/s",
            f"rows {shapes['packed']}; {mix['packed'] / mix['padded']:.2f}x padded, "
            f"{mix['packed'] / mix_naive:.2f}x naive",
        ),
        (f"SFT skewed mix, padded (ours, {dtype})", f"{mix['padded']:,.0f} tok/s", f"rows {shapes['padded']}"),
        ("SFT skewed mix, naive HF fp32 (peer)", f"{mix_naive:,.0f} tok/s", "padded, labels=-100, attention mask"),
    ]


if __name__ == "__main__":
    main()
