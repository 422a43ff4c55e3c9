"""The Python side of bench/gpu/check.sh: random-weight model directories of the two shapes, and the report.

    python bench/gpu/stage_check.py model ARCH DIR [--layers N]   # an HF dir the stage driver loads as model.source
    python bench/gpu/stage_check.py report DIR [--peak-tflops X]  # DIR/*.json of the driver -> check.json, check.md

Models: bench/bench_gpu.py's configs (smollm2-135m's Llama shape, the ~0.5B Qwen2 shape), random weights, saved
with the tiny tokenizer. The model's vocabulary stays the real one (49,152 or 151,936 rows in the head, a large
share of the FLOPs); the tokenizer's 1,024 ids are a subset of it, and ids it lacks decode to nothing.

Report, per driver run (`<name>.json`, written by `python -m cascade.stages.run ... --metrics-json`):
- SFT: trained tokens per second (the rows' own tokens, padding excluded) over the steps after the first (the first
  pays for kernel selection and the allocator), and MFU = tokens/s x FLOPs per token / the GPU's bf16 peak, FLOPs per
  token = 6 x matmul parameters + 12 x layers x hidden x sequence (the PaLM count, as bench_gpu.py counts), with the
  packed row's length as the sequence; mfu_6n counts the matmuls alone (6 x matmul parameters): packed rows of ~50
  tokens need little of the attention the PaLM count credits, and a block-sparse attention skips most of it.
- GRPO: sampled tokens/s over the rollout seconds, and the update's tokens/s and MFU over its seconds. The update's
  FLOPs count the completion tokens only (each prompt is forwarded once per group), so its MFU is a lower bound.
- Loss curves: `<name>-main.json` (the check's device) against `<name>-ref.json` (the CPU, fp32), the largest
  relative difference per SFT step.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "bench" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)


def make_model(arch: str, out: Path, layers: int | None) -> None:
    from cascade.stages.train.model import save_hf
    from cascade.stages.train.tokenizer import load_tokenizer

    model = bench_gpu.build_model(arch, "cpu", seed=0, num_layers=layers)
    save_hf(model, load_tokenizer(), out)
    print(f"{arch}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {out}")


def model_shape(run: dict[str, Any]) -> dict[str, Any] | None:
    """Matmul parameters, layers and hidden size of the model a run trained, from its SFT checkpoint's config."""
    checkpoint = run.get("sft", {}).get("checkpoint", "")
    config_file = Path(checkpoint.removeprefix("file://")) / "model" / "config.json"
    if not config_file.is_file():
        return None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_file.parent))
    return {
        "matmul_params": bench_gpu.matmul_params(model),
        "layers": model.config.num_hidden_layers,
        "hidden": model.config.hidden_size,
    }


def steady(rows: list[dict[str, float]], key: str) -> float:
    """The median of `key` over the steps after the first."""
    values = [r[key] for r in rows[1:] or rows if key in r]
    return statistics.median(values) if values else float("nan")


def flops_per_token(shape: dict[str, Any], seq_len: float) -> float:
    return 6.0 * shape["matmul_params"] + 12.0 * shape["layers"] * shape["hidden"] * seq_len


def sft_row(
    name: str, stage: dict[str, Any], shape: dict[str, Any] | None, peak: float | None, seq_len: float
) -> dict[str, Any]:
    steps = stage.get("steps", [])
    tokens_per_s = steady(steps, "tokens_trained") / steady(steps, "step_seconds")
    mfu = tokens_per_s * flops_per_token(shape, seq_len) / (peak * 1e12) if shape and peak else None
    mfu_6n = tokens_per_s * flops_per_token(shape, 0) / (peak * 1e12) if shape and peak else None
    return {
        "run": name,
        "stage": "sft",
        "steps": len(steps),
        "step_s": steady(steps, "step_seconds"),
        "tokens_per_s": tokens_per_s,
        "mfu": mfu,
        "mfu_6n": mfu_6n,
        "final_loss": stage["metrics"].get("final_loss"),
    }


def grpo_row(
    name: str, stage_name: str, stage: dict[str, Any], shape: dict[str, Any] | None, peak: float | None, seq_len: float
) -> dict[str, Any]:
    steps = stage.get("steps", [])
    update_tokens_per_s = steady(steps, "tokens_trained") / steady(steps, "update_seconds")
    mfu = update_tokens_per_s * flops_per_token(shape, seq_len) / (peak * 1e12) if shape and peak else None
    return {
        "run": name,
        "stage": stage_name,
        "steps": len(steps),
        "step_s": steady(steps, "step_seconds"),
        "sampled_tokens_per_s": steady(steps, "tokens_sampled") / steady(steps, "rollout_seconds"),
        "update_tokens_per_s": update_tokens_per_s,
        "update_mfu": mfu,
        "logprob_mismatch": steady(steps, "logprob_mismatch"),
    }


def curve_gap(main: dict[str, Any], ref: dict[str, Any], early: int = 10) -> dict[str, Any]:
    """The SFT loss curves' largest relative difference over the first `early` steps (before bf16 rounding has
    compounded through the optimizer) and over all of them, and the final losses."""
    a = [r["loss"] for r in main["sft"]["steps"]]
    b = [r["loss"] for r in ref["sft"]["steps"]]
    return {
        "main_loss": a,
        "ref_loss": b,
        "early_steps": min(early, len(a)),
        "max_relative_gap_early": bench_gpu.max_relative_gap(a[:early], b[:early]),
        "max_relative_gap": bench_gpu.max_relative_gap(a, b),
        "final": [a[-1], b[-1]],
    }


def report(out: Path, peak: float | None, seq_len: float) -> dict[str, Any]:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.stem != "check"}
    if not runs:
        raise SystemExit(f"stage_check report: no driver metrics (*.json) in {out}")
    rows = []
    for name, run in runs.items():
        shape = model_shape(run)
        for stage_name, stage in run.items():
            if "steps" not in stage:
                continue  # adopted: it ran elsewhere (the carried SFT data)
            rows.append(
                sft_row(name, stage, shape, peak, seq_len)
                if stage_name == "sft"
                else grpo_row(name, stage_name, stage, shape, peak, seq_len)
            )
    curves = {
        name.removesuffix("-main"): curve_gap(run, runs[name.replace("-main", "-ref")])
        for name, run in runs.items()
        if name.endswith("-main") and name.replace("-main", "-ref") in runs
    }
    result = {"peak_tflops": peak, "rows": rows, "curves": curves}
    (out / "check.json").write_text(json.dumps(result, indent=1))
    (out / "check.md").write_text(markdown(result))
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)

    keys = [
        "run",
        "stage",
        "steps",
        "step_s",
        "tokens_per_s",
        "mfu",
        "mfu_6n",
        "sampled_tokens_per_s",
        "update_tokens_per_s",
        "update_mfu",
        "final_loss",
        "logprob_mismatch",
    ]
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    lines += ["| " + " | ".join(cell(row.get(k)) for k in keys) + " |" for row in result["rows"]]
    lines += [
        "",
        "| SFT loss curve, the check's device vs the CPU in fp32 | steps | max relative gap, first steps | "
        "max relative gap, all | final losses |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {name} | {len(c['main_loss'])} | {c['max_relative_gap_early']:.3g} (first {c['early_steps']}) | "
        f"{c['max_relative_gap']:.3g} | {c['final'][0]:.4f} / {c['final'][1]:.4f} |"
        for name, c in result["curves"].items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model")
    model.add_argument("arch", choices=list(bench_gpu.ARCHS))
    model.add_argument("dir", type=Path)
    model.add_argument("--layers", type=int, help="fewer layers than the shape's (the CPU dry run)")
    rep = sub.add_parser("report")
    rep.add_argument("dir", type=Path)
    rep.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak; default: from its name")
    rep.add_argument("--seq-len", type=float, default=2048, help="the packed row length, for the attention FLOPs")
    args = parser.parse_args(argv)
    if args.command == "model":
        make_model(args.arch, args.dir, args.layers)
        return 0
    peak = args.peak_tflops
    if peak is None:
        import torch

        peak = bench_gpu.gpu_peak_tflops()[1] if torch.cuda.is_available() else None
    report(args.dir, peak, args.seq_len)
    return 0


if __name__ == "__main__":
    sys.exit(main())
