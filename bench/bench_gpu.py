"""SFT and GRPO steps on one CUDA GPU: tokens/s, MFU against the GPU's bf16 peak, and the CPU loss curve.

Models are built from their configs with random weights (throughput needs no trained weights, and large files do
not travel to a GPU machine): smollm2-135m's architecture (Llama, 30 layers, hidden 576, GQA 9/3, tied
embeddings, vocab 49152) and a ~0.5B Qwen2 shape (Qwen2.5-0.5B's: 24 layers, hidden 896, GQA 14/2, tied, vocab
151936). Training is as our stages train: fp32 master weights, bf16 autocast, fused AdamW (0.9, 0.95), the loss
normalized by the global token count (stages/train/losses.py, imported as is: it needs only torch).

- SFT step: B x T random tokens, the second half of each row is the response (the loss mask).
- GRPO step: P prompts x G samples sampled with the model's own KV cache (HF `generate`), a reward that is a
  fixed function of the sampled tokens (the share of even token ids: throughput needs a reward with variance,
  not a task), group-normalized advantages, one on-policy update.
- MFU = achieved FLOP/s / peak, with FLOPs per trained token = 6 * N_matmul + 12 * L * H * T (the PaLM
  count: weights, plus attention scores and values); N_matmul counts every Linear including the LM head.
- Loss curve: the same initial weights and batch for `--curve-steps` SFT steps on cuda (bf16 autocast) and on
  the CPU (fp32); the largest relative difference per step is reported (bf16 keeps ~3 significant digits).

Needs only torch (CUDA build) and transformers. Run from the repo root:
    python bench/bench_gpu.py [--arch smollm2-135m qwen2-0.5b] [--steps 10] [--out results.json]
Without CUDA it says so and exits 0 with nothing measured (tests/gpu/ skip the same way).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cascade.stages.train.losses import grpo_advantages, grpo_loss, sft_loss, token_logprobs  # noqa: E402  (torch only)

# dense bf16 tensor-core peaks (no sparsity), from the vendor datasheets; an unknown GPU reports no MFU
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


def smollm2_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def qwen2_half_b_config():
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=151645,
        pad_token_id=151643,
    )


ARCHS: dict[str, Callable[[], Any]] = {"smollm2-135m": smollm2_config, "qwen2-0.5b": qwen2_half_b_config}


def build_model(arch: str, device: str, seed: int = 0, num_layers: int | None = None) -> torch.nn.Module:
    """Random weights, fp32 (the master copy; bf16 comes from autocast), seeded so cpu and cuda start equal."""
    from transformers import AutoModelForCausalLM

    config = ARCHS[arch]()
    if num_layers is not None:
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None):  # Qwen2 lists one attention type per layer
            config.layer_types = config.layer_types[:num_layers]
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(device).train()


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters that take part in a matmul per token: every Linear, the LM head included (tied or not)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    cfg = model.config
    return 6.0 * matmul_params(model) + 12.0 * cfg.num_hidden_layers * cfg.hidden_size * seq_len


def make_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0, fused=True)


def autocast(device: str, bf16: bool):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=bf16)


def sft_batch(vocab: int, batch: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] and a response mask [B, T-1] aligned with the targets ids[:, 1:] (the second half of a row)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, seq_len), generator=g)
    mask = torch.zeros(batch, seq_len - 1)
    mask[:, seq_len // 2 :] = 1.0
    return ids, mask


def sft_step(model, optimizer, ids, mask, device: str, bf16: bool) -> float:
    ids, mask = ids.to(device), mask.to(device)
    num_tokens = int(mask.sum())
    with autocast(device, bf16):
        logits = model(input_ids=ids).logits[:, :-1]
    loss = sft_loss(token_logprobs(logits, ids[:, 1:]), mask, num_tokens)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def grpo_step(
    model, optimizer, prompts: torch.Tensor, group: int, new_tokens: int, device: str, bf16: bool
) -> dict[str, float]:
    """One on-policy GRPO step: sample, score, normalize per group, update. prompts: [P, T_p] token ids."""
    prompts = prompts.to(device)
    started = time.perf_counter()
    model.eval()
    with torch.no_grad(), autocast(device, bf16):
        out = model.generate(
            input_ids=prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=True,
            num_return_sequences=group,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            pad_token_id=model.config.pad_token_id,
        )
    model.train()
    sync(device)
    sampled = time.perf_counter()
    completion = out[:, prompts.shape[1] :]  # [P*G, new_tokens]
    rewards = (completion % 2 == 0).float().mean(-1).view(-1, group)  # [P, G]
    advantages = grpo_advantages(rewards, 1e-6).view(-1)  # [P*G]
    mask = torch.zeros(out.shape[0], out.shape[1] - 1, device=device)
    mask[:, prompts.shape[1] - 1 :] = 1.0  # the targets ids[:, 1:] that are sampled tokens
    loss = grpo_backward(model, out, mask, advantages, device, bf16)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(device)
    return {
        "loss": loss,
        "sample_s": sampled - started,
        "update_s": time.perf_counter() - sampled,
        "sampled_tokens": completion.numel(),
        "trained_tokens": out.numel(),
    }


def grpo_backward(
    model, ids: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor, device: str, bf16: bool, micro: int = 16
) -> float:
    """The GRPO loss of rollouts ids [N, T] (mask [N, T-1] on sampled targets, advantages [N]), backwarded in
    micro-batches of `micro` rows, each normalized by the global token count (the sum is the full batch's loss):
    128 rows of 384 tokens over a 151,936-token vocabulary are 28 GiB of fp32 logits at once."""
    ids, mask, advantages = ids.to(device), mask.to(device), advantages.to(device)
    num_tokens, total = int(mask.sum()), 0.0
    for part in (slice(i, i + micro) for i in range(0, len(ids), micro)):
        with autocast(device, bf16):
            logits = model(input_ids=ids[part]).logits[:, :-1]
        logp = token_logprobs(logits, ids[part, 1:])
        loss = grpo_loss(logp, logp.detach(), advantages[part], mask[part], num_tokens)
        loss.backward()
        total += float(loss.detach())
    return total


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gpu_peak_tflops() -> tuple[str, float | None]:
    name = torch.cuda.get_device_name()
    return name, next((peak for key, peak in BF16_PEAK_TFLOPS.items() if key in name), None)


def bench_sft(arch: str, steps: int, batch: int, seq_len: int) -> dict[str, Any]:
    model = build_model(arch, "cuda")
    optimizer = make_optimizer(model, 1e-5)
    ids, mask = sft_batch(model.config.vocab_size, batch, seq_len, seed=0)
    sft_step(model, optimizer, ids, mask, "cuda", True)  # warm-up: kernels, allocator
    torch.cuda.reset_peak_memory_stats()
    sync("cuda")
    started = time.perf_counter()
    for _ in range(steps):
        sft_step(model, optimizer, ids, mask, "cuda", True)
    sync("cuda")
    seconds = (time.perf_counter() - started) / steps
    tokens_per_s = batch * seq_len / seconds
    name, peak = gpu_peak_tflops()
    achieved = tokens_per_s * flops_per_token(model, seq_len)
    return {
        "arch": arch,
        "what": "sft",
        "gpu": name,
        "batch": batch,
        "seq_len": seq_len,
        "step_s": seconds,
        "tokens_per_s": tokens_per_s,
        "tflops": achieved / 1e12,
        "mfu": achieved / (peak * 1e12) if peak else None,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "params": sum(p.numel() for p in model.parameters()),
    }


def bench_grpo(arch: str, steps: int, prompts: int, group: int, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    model = build_model(arch, "cuda")
    optimizer = make_optimizer(model, 1e-6)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(3, model.config.vocab_size, (prompts, prompt_len), generator=g)
    grpo_step(model, optimizer, batch, group, new_tokens, "cuda", True)  # warm-up
    rows = [grpo_step(model, optimizer, batch, group, new_tokens, "cuda", True) for _ in range(steps)]
    sample_s = sum(r["sample_s"] for r in rows) / steps
    update_s = sum(r["update_s"] for r in rows) / steps
    trained = rows[0]["trained_tokens"]
    name, peak = gpu_peak_tflops()
    achieved = trained / update_s * flops_per_token(model, prompt_len + new_tokens)
    return {
        "arch": arch,
        "what": "grpo",
        "gpu": name,
        "prompts": prompts,
        "group": group,
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "step_s": sample_s + update_s,
        "sample_s": sample_s,
        "update_s": update_s,
        "sampled_tokens_per_s": rows[0]["sampled_tokens"] / sample_s,
        "update_tokens_per_s": trained / update_s,
        "update_mfu": achieved / (peak * 1e12) if peak else None,
    }


def loss_curve(
    arch: str, device: str, bf16: bool, steps: int, batch: int = 2, seq_len: int = 64, num_layers: int | None = None
) -> list[float]:
    """SFT losses of `steps` steps on one seeded batch from seeded weights, the same on every device; the batch
    repeats, so the loss falls step by step (the model memorizes it) and the curve has a shape to compare."""
    model = build_model(arch, device, seed=0, num_layers=num_layers)
    optimizer = make_optimizer(model, 1e-4)
    ids, mask = sft_batch(model.config.vocab_size, batch, seq_len, seed=0)
    return [sft_step(model, optimizer, ids, mask, device, bf16) for _ in range(steps)]


def max_relative_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--curve-steps", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured (run it on a GPU machine)")
        return 0
    results: list[dict[str, Any]] = []
    for arch in args.arch:
        results.append(bench_sft(arch, args.steps, batch=16, seq_len=1024))
        results.append(bench_grpo(arch, max(2, args.steps // 3), prompts=16, group=8, prompt_len=128, new_tokens=256))
        gpu_curve = loss_curve(arch, "cuda", True, args.curve_steps)
        cpu_curve = loss_curve(arch, "cpu", False, args.curve_steps)
        results.append(
            {
                "arch": arch,
                "what": "loss_curve",
                "cuda_bf16": gpu_curve,
                "cpu_fp32": cpu_curve,
                "max_relative_gap": max_relative_gap(gpu_curve, cpu_curve),
            }
        )
        torch.cuda.empty_cache()
        for row in results[-3:]:  # as each arch ends: a run cut off by its time limit keeps what it measured
            print(json.dumps(row), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
