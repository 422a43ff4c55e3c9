"""Rollout throughput: the in-process HF engine vs plain `model.generate` (and the vLLM server), plus weight-sync cost.

    PYTHONPATH=. .venv/bin/python bench/bench_rollout.py --engines hf,generate [--model smollm2-135m]
        [--domain math --prompts 64 --samples 8 --tokens 64 --rounds 3 --hf-batch 128 --sync-steps 5]
        [--device cuda --dtype bfloat16] [--engines hf,hf-other --other-decoder OLD.py]
        [--engines hf-shared_prefix,hf-per_row,hf-cuda_graphs]

Every engine samples the same model (`--model`: `tiny`, the project's default random-init tiny model, on which
nearly every completion runs to the token limit; `smollm2-135m`; or an HF dir) on a domain's train prompts
(`--domain`, math by default) at temperature 1, on `--device`. Generated tokens are counted from what each engine
returns; our engine also returns per-token logprobs, `generate` does not. `hf` is our engine with its default
decode step (engine.hf_decoder auto); `hf-<decoder>` with engine.hf_decoder <decoder> (shared_prefix, per_row,
cuda_graphs, hf), so one command compares the cache layouts. `hf-other` is hf-shared_prefix with the lean
decode step of another version of stages/engines/decode.py (`git show REF:stages/engines/decode.py > OLD.py`): an
A/B of a decoder change on the same machine, model, prompts and seeds. HF engines run `--rounds` times,
alternating which goes first, and the table gives tokens/s per round, the median, and the ratio to `generate`,
with the load average at each timing.
`vllm` (needs `bash infra/vllm-venv.sh`) runs once, with its weight sync: its server reserves one of the
machine's cores for its own scheduler by default; `--vllm-bind 0-1` lets its worker use both.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from cascade.stages.domains import get_domain  # noqa: E402
from cascade.stages.engines import hf as hf_module  # noqa: E402
from cascade.stages.engines.hf import HFEngine  # noqa: E402
from cascade.stages.engines.interface import SamplingParams  # noqa: E402
from cascade.stages.engines.vllm import ServerOptions, VLLMEngine, trainer_logprobs  # noqa: E402
from cascade.stages.recipe.sections import ModelConfig  # noqa: E402
from cascade.stages.train.model import initial_model, prompt_ids, save_hf  # noqa: E402

HF_DECODERS = ("shared_prefix", "per_row", "cuda_graphs", "hf")  # engine hf-<decoder>: EngineConfig.hf_decoder


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
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    mask = mask.to(model.device)
    model.eval()
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=tokens,
        num_return_sequences=samples,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=pad,
    )
    seconds = time.perf_counter() - t0
    new = out[:, width:]
    eos = tokenizer.eos_token_id
    counted = sum(int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else len(row) for row in new)
    return counted, seconds


def bench_sync(engine, model, steps: int) -> dict[str, float]:
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


def logprob_mismatch(engine, model, prompts: list[list[int]]) -> float:
    """Mean |pi_inf - pi_train| over sampled tokens of a few prompts: what MOPD's importance weight sees."""
    few = prompts[:8]
    out = engine.generate(few, 2, SamplingParams(temperature=1.0, max_new_tokens=32, seed=0))
    diffs = []
    for prompt, row in zip(few, out, strict=True):
        for c in row:
            train = trainer_logprobs(model, prompt + c.token_ids)[len(prompt) - 1 :]
            diffs += [abs(a - b) for a, b in zip(c.logprobs, train, strict=True)]
    return statistics.mean(diffs)


def vllm_rows(args: argparse.Namespace, model, tokenizer, prompts, sampling) -> list[tuple[str, str]]:
    """The managed vLLM server on the same weights: rollout tokens/s, its logprob mismatch, weight-sync cost."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        save_hf(model, tokenizer, tmp)
        extra_env = {"VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind} if args.vllm_bind else {}
        with VLLMEngine(tmp, options=ServerOptions(extra_env=extra_env)) as engine:
            rows.append(("vLLM server start (s)", f"{engine.start_seconds:.1f}"))
            engine.generate(prompts[:4], 2, SamplingParams(max_new_tokens=8))  # warm-up
            n_tok, secs = timed_tokens(lambda: engine.generate(prompts, args.samples, sampling))
            rows.append(("vLLM rollout tok/s", f"{n_tok / secs:.0f}  ({n_tok} tok in {secs:.1f}s, load {load():.1f})"))
            rows.append(("vLLM mean |pi_inf - pi_train|", f"{logprob_mismatch(engine, model, prompts):.2e}"))
            sync = bench_sync(engine, model, args.sync_steps)
            rows.append((f"weight sync s/step (mean of {args.sync_steps})", f"{sync['total_s']:.3f}"))
            parts = " / ".join(f"{sync[k]:.3f}" for k in ("write_s", "reload_s", "probe_s"))
            rows.append(("  write / reload / probe (s)", parts))
            rows.append(("  probe max |diff|", f"{sync['probe_max_abs_diff']:.1e}"))
    return rows


def load() -> float:
    return os.getloadavg()[0]


def load_model(source: str, device: str, dtype: str):
    model, tokenizer = initial_model(ModelConfig(source=source), seed=0)
    return model.eval().to(device, getattr(torch, dtype)), tokenizer


def other_decoder(path: str):
    """The LeanDecoder class of another version of stages/engines/decode.py."""
    spec = importlib.util.spec_from_file_location("other_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LeanDecoder


def with_decoder(decoder, generate):
    """Run generate() with the HF engine's lean decode step swapped for `decoder`."""
    ours = hf_module.LeanDecoder
    hf_module.LeanDecoder = decoder
    try:
        return generate()
    finally:
        hf_module.LeanDecoder = ours


def hf_rounds(args: argparse.Namespace, model, tokenizer, prompts, sampling) -> dict[str, list[tuple[float, float]]]:
    """engine -> [(tokens/s, load average)] per round; each round rotates which engine goes first."""

    def hf_timer(decoder: str):
        engine = HFEngine(model, tokenizer, batch_size=args.hf_batch, decoder=decoder)
        return lambda: timed_tokens(lambda: engine.generate(prompts, args.samples, sampling))

    timers = {"generate": lambda: plain_generate(model, tokenizer, prompts, args.samples, args.tokens)}
    for name in args.engines:
        if name == "hf" or name.removeprefix("hf-") in HF_DECODERS:
            timers[name] = hf_timer("auto" if name == "hf" else name.removeprefix("hf-"))
    if args.other_decoder:
        other, shared = other_decoder(args.other_decoder), hf_timer("shared_prefix")
        timers["hf-other"] = lambda: with_decoder(other, shared)
    names = [e for e in args.engines if e in timers]
    results: dict[str, list[tuple[float, float]]] = {e: [] for e in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            n_tok, secs = timers[name]()
            results[name].append((n_tok / secs, load()))
            print(
                f"  round {r + 1} {name:<16} {n_tok / secs:8.0f} tok/s  ({n_tok} tok in {secs:.2f}s, load {load():.2f})"
            )
    return results


def table(results: dict[str, list[tuple[float, float]]]) -> list[str]:
    base = statistics.median(t for t, _ in results["generate"]) if "generate" in results else None
    lines = ["| engine | tok/s per round (load) | median tok/s | vs generate |", "|---|---|---|---|"]
    for name, runs in results.items():
        median = statistics.median(t for t, _ in runs)
        per_round = ", ".join(f"{t:.0f} ({la:.1f})" for t, la in runs)
        ratio = f"{median / base:.2f}x" if base else "-"
        lines.append(f"| {name} | {per_round} | {median:.0f} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny, smollm2-135m, or an HF model dir")
    parser.add_argument(
        "--engines",
        default="hf,generate,vllm",
        type=lambda s: s.split(","),
        help="comma list of hf, hf-<decoder> (hf-shared_prefix, hf-per_row, hf-cuda_graphs, hf-hf), hf-other, "
        "generate, vllm (vllm needs the vLLM venv)",
    )
    parser.add_argument("--other-decoder", default="", help="hf-other's stages/engines/decode.py (another version)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the vLLM server runs on the CPU)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the model's weights")
    parser.add_argument(
        "--domain", default="math", help="whose train prompts to sample (swe's are ~270 tokens, math's ~30)"
    )
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each HF engine, alternating")
    parser.add_argument(
        "--hf-batch", type=int, default=128, help="rows per batch of our HF engine (the recipe default)"
    )
    parser.add_argument("--sync-steps", type=int, default=5)
    parser.add_argument("--vllm-bind", default="", help="VLLM_CPU_OMP_THREADS_BIND for the server, e.g. 0-1")
    parser.add_argument("--unseeded", action="store_true", help="sample without a seed")
    args = parser.parse_args()
    unknown = set(args.engines) - {"hf", "hf-other", "generate", "vllm", *(f"hf-{d}" for d in HF_DECODERS)}
    if unknown:
        parser.error(f"unknown engines: {', '.join(sorted(unknown))}")
    if ("hf-other" in args.engines) != bool(args.other_decoder):
        parser.error("hf-other and --other-decoder go together")
    model, tokenizer = load_model(args.model, args.device, args.dtype)
    items = get_domain(args.domain).generate("train", args.prompts, seed=0)
    prompts = [prompt_ids(tokenizer, item.prompt) for item in items]
    # Seeded requests go to vLLM one prompt each (see stages/engines/vllm/engine.py); --unseeded batches 64 per request.
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=None if args.unseeded else 0)
    shape = f"{args.prompts} {args.domain} prompts x {args.samples} samples x {args.tokens} tokens"
    print(
        f"rollout on {args.model} ({args.device}, {args.dtype}): {shape}, {'unseeded' if args.unseeded else 'seeded'}, "
        f"hf batch {args.hf_batch}, torch threads {torch.get_num_threads()}, load {load():.2f}"
    )
    results = hf_rounds(args, model, tokenizer, prompts, sampling)
    print("\n".join(table(results)))
    if "vllm" in args.engines:
        rows = vllm_rows(args, model, tokenizer, prompts, sampling)
        width = max(len(k) for k, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
