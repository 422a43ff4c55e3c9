"""Throughput of the tiny model on this CPU: SFT step and rollout generation, beside their plain-HF peers.

Prints one table:
- matmul peak (fp32 and bf16, 2048x2048) measured here, the ceiling the others are read against;
- SFT step tokens/s (ours: bf16 autocast, token-normalized loss) vs a naive HF step (fp32, `labels=`),
  and the fraction of the matmul peak reached, counting 6 * N_params * tokens FLOPs;
- rollout tokens/s: our HF engine (KV cache, left padding, per-token logprobs) vs HF `generate`.

Run: .venv/bin/python bench/bench_throughput.py [--steps 20]
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch

from stages.engines.base import SamplingParams
from stages.engines.hf import HFEngine
from stages.losses import sft_loss, token_logprobs
from stages.model import build_tiny_model, num_parameters, prompt_ids
from stages.config import ModelConfig
from stages.tokenizer import load_tokenizer
from stages.training import make_optimizer


def autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else nullcontext()


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 10) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def sft_step_tps(model, ids: torch.Tensor, steps: int, bf16: bool, naive: bool) -> float:
    opt = make_optimizer(model, 1e-4, 0.0)
    mask = torch.ones(ids.shape[0], ids.shape[1] - 1)
    for i in range(steps + 3):
        if i == 3:
            t0 = time.perf_counter()
        with autocast(bf16):
            if naive:
                loss = model(input_ids=ids, labels=ids).loss
            else:
                logits = model(input_ids=ids).logits[:, :-1]
                loss = sft_loss(token_logprobs(logits, ids[:, 1:]), mask, int(mask.sum()))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * ids.numel() / (time.perf_counter() - t0)


def generate_tps(model, tok, prompts: list[list[int]], n: int, new_tokens: int) -> tuple[float, float]:
    engine = HFEngine(model, tok, batch_size=len(prompts) * n, seed=0)
    t0 = time.perf_counter()
    out = engine.generate(prompts, n, SamplingParams(max_new_tokens=new_tokens, seed=0))
    ours = sum(len(c.token_ids) for g in out for c in g) / (time.perf_counter() - t0)
    ids = torch.tensor([p for p in prompts])
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=new_tokens,
                             num_return_sequences=n, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    peer = (gen.shape[1] - ids.shape[1]) * gen.shape[0] / (time.perf_counter() - t0)
    return ours, peer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    tok = load_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), seed=0)
    n_params = num_parameters(model)
    peak32, peak16 = matmul_peak(torch.float32), matmul_peak(torch.bfloat16)
    ids = torch.randint(3, len(tok), (32, 128))
    ours = sft_step_tps(model, ids, args.steps, bf16=True, naive=False)
    naive = sft_step_tps(build_tiny_model(ModelConfig(), len(tok), seed=0), ids, args.steps, bf16=False, naive=True)
    prompts = [prompt_ids(tok, f"Compute {i % 10}+{(i * 7) % 10}-{(i * 3) % 10}.") for i in range(64)]
    gen_ours, gen_peer = generate_tps(model.eval(), tok, prompts, n=8, new_tokens=64)
    rows = [
        ("matmul peak fp32 / bf16", f"{peak32 / 1e9:.0f} / {peak16 / 1e9:.0f} GFLOP/s", ""),
        ("SFT step, B32 x T128 (ours, bf16)", f"{ours:,.0f} tok/s", f"{6 * n_params * ours / peak16:.0%} of bf16 peak"),
        ("SFT step, naive HF fp32 (peer)", f"{naive:,.0f} tok/s", f"{6 * n_params * naive / peak32:.0%} of fp32 peak"),
        ("rollout 64 x 8 x 64 (ours, HFEngine)", f"{gen_ours:,.0f} new tok/s", "with per-token logprobs"),
        ("rollout 64 x 8 x 64 (HF generate, peer)", f"{gen_peer:,.0f} new tok/s", "no logprobs"),
    ]
    print(f"tiny model: {n_params / 1e6:.2f}M parameters, torch {torch.__version__}, {torch.get_num_threads()} threads")
    width = max(len(r[0]) for r in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>22}  {note}")


if __name__ == "__main__":
    main()
