"""Rollout throughput: vLLM server vs the in-process HF engine vs plain `model.generate`, plus weight-sync cost.

    PYTHONPATH=. .venv/bin/python bench/bench_rollout.py [--prompts 64 --samples 8 --tokens 64 --sync-steps 5]

All three sample the project's default tiny model (random init, so nearly every completion runs to the token
limit) on math-domain prompts at temperature 1. Generated tokens are counted from what each engine returns.
The vLLM server reserves one of the machine's cores for its own scheduler by default; `--vllm-bind 0-1` lets
its worker use both. Needs `bash infra/vllm-venv.sh`.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from stages.domains import get_domain  # noqa: E402
from stages.engines.base import SamplingParams  # noqa: E402
from stages.engines.hf import HFEngine  # noqa: E402
from stages.engines.vllm import ServerOptions, VLLMEngine, trainer_logprobs  # noqa: E402
from stages.model import build_tiny_model, prompt_ids, save_hf  # noqa: E402
from stages.config import ModelConfig  # noqa: E402
from stages.tokenizer import load_tokenizer  # noqa: E402


def timed_tokens(fn) -> tuple[int, float]:
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    return sum(len(c.token_ids) for row in out for c in row), seconds


@torch.no_grad()
def plain_generate(model, tokenizer, prompts: list[list[int]], samples: int, tokens: int) -> tuple[int, float]:
    """One left-padded `model.generate` call over every prompt x sample: the reference with no engine around it."""
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    model.eval()
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=tokens, num_return_sequences=samples, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
    )
    seconds = time.perf_counter() - t0
    new = out[:, width:]
    eos = tokenizer.eos_token_id
    counted = sum(int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else len(row) for row in new)
    return counted, seconds


def bench_sync(engine: VLLMEngine, model, steps: int) -> dict[str, float]:
    """Per step: one SGD step on random tokens (so the weights really change), then sync_weights."""
    policy = copy.deepcopy(model).train()
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = torch.randint(0, model.config.vocab_size, (4, 32), generator=gen)
        loss = policy(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        engine.sync_weights(policy)
    keys = ("total_s", "write_s", "reload_s", "probe_s", "probe_max_abs_diff")
    return {k: statistics.mean(h[k] for h in engine.sync_history) for k in keys}


def logprob_mismatch(engine: VLLMEngine, model, prompts: list[list[int]]) -> float:
    """Mean |pi_inf - pi_train| over sampled tokens of a few prompts: what MOPD's importance weight sees."""
    few = prompts[:8]
    out = engine.generate(few, 2, SamplingParams(temperature=1.0, max_new_tokens=32, seed=0))
    diffs = []
    for prompt, row in zip(few, out, strict=True):
        for c in row:
            train = trainer_logprobs(model, prompt + c.token_ids)[len(prompt) - 1 :]
            diffs += [abs(a - b) for a, b in zip(c.logprobs, train, strict=True)]
    return statistics.mean(diffs)


def run(args: argparse.Namespace) -> list[tuple[str, str]]:
    tokenizer = load_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tokenizer), seed=0).eval()
    items = get_domain("math").generate("train", args.prompts, seed=0)
    prompts = [prompt_ids(tokenizer, item.prompt) for item in items]
    # Seeded requests go to vLLM one prompt each (see stages/engines/vllm/engine.py); --unseeded batches 64 per request.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=None if args.unseeded else 0)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        save_hf(model, tokenizer, tmp)
        extra_env = {"VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind} if args.vllm_bind else {}
        with VLLMEngine(tmp, options=ServerOptions(extra_env=extra_env)) as engine:
            rows.append(("vLLM server start (s)", f"{engine.start_seconds:.1f}"))
            engine.generate(prompts[:4], 2, SamplingParams(max_new_tokens=8))  # warm-up
            n_tok, secs = timed_tokens(lambda: engine.generate(prompts, args.samples, sampling))
            rows.append(("vLLM rollout tok/s", f"{n_tok / secs:.0f}  ({n_tok} tok in {secs:.1f}s)"))
            rows.append(("vLLM mean |pi_inf - pi_train|", f"{logprob_mismatch(engine, model, prompts):.2e}"))
            sync = bench_sync(engine, model, args.sync_steps)
            rows.append((f"weight sync s/step (mean of {args.sync_steps})", f"{sync['total_s']:.3f}"))
            parts = " / ".join(f"{sync[k]:.3f}" for k in ("write_s", "reload_s", "probe_s"))
            rows.append(("  write / reload / probe (s)", parts))
            rows.append(("  probe max |diff|", f"{sync['probe_max_abs_diff']:.1e}"))
    hf = HFEngine(model, tokenizer)
    n_tok, secs = timed_tokens(lambda: hf.generate(prompts, args.samples, sampling))
    rows.append(("HFEngine rollout tok/s", f"{n_tok / secs:.0f}  ({n_tok} tok in {secs:.1f}s)"))
    if not args.skip_plain:
        n_tok, secs = plain_generate(model, tokenizer, prompts, args.samples, args.tokens)
        rows.append(("plain HF generate tok/s", f"{n_tok / secs:.0f}  ({n_tok} tok in {secs:.1f}s)"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--sync-steps", type=int, default=5)
    parser.add_argument("--vllm-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND for the server, e.g. 0-1")
    parser.add_argument("--skip-plain", action="store_true", help="skip plain model.generate")
    parser.add_argument("--unseeded", action="store_true", help="sample without a seed")
    args = parser.parse_args()
    rows = run(args)
    width = max(len(k) for k, _ in rows)
    shape = f"{args.prompts} prompts x {args.samples} samples x {args.tokens} tokens"
    seeded = "unseeded" if args.unseeded else "seeded"
    print(f"\nrollout: {shape}, {seeded}, torch threads {torch.get_num_threads()}")
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
