"""Importance correction against none, in bf16: does GRPO with `tis` learn at least as much as without it?

    PYTHONPATH=. .venv/bin/python bench/bench_importance.py --store file://$CASCADE_HOME --run-ids R1 R2 R3 \
        [--recipe tiny --domain math --split dev --dtype bf16 --variants none tis --set KEY=VALUE ... --threads 2]

For each run (one per seed), from its last committed SFT checkpoint (or --start STAGE's): the recipe's GRPO
stage on the domain, once per `importance_correction` variant, with `compute.dtype` set (bf16: the trainer's and
the engine's logprobs differ by rounding, which is what the correction weighs), in this process (bench_learning's
one-stage recipe, the run's own seed, no step checkpoints, `--set` stage settings on top: with one variant, the
bench compares other settings of the stage). The start and each variant are scored on the same items of the eval
split with the same per-item seeds. Printed per seed: each variant's paired gain over the start (primary metric
and greedy), the last variant minus the first, and the mean logprob mismatch and corrected-token fraction the
stage logged; then the mean of each over seeds with its standard error across seeds (--json: every model's column
means too). Settings are compared on --split dev; heldout is read once, for a recorded result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from pathlib import Path
from tempfile import TemporaryDirectory

import yaml
from bench_grpo import run_main
from bench_learning import bench_recipe, grpo_stage, item_scores, sft_checkpoint, train_ours
from learning_table import format_gain

from cascade.artifacts.html_report import paired_gain
from cascade.artifacts.score_columns import GREEDY, ScoreColumn
from cascade.artifacts.store import Store
from cascade.stages.recipe.schema import Recipe, load_recipe


def train_variants(args: argparse.Namespace, base: Recipe, run_id: str, work: Path) -> dict:
    """One run's start checkpoint and each variant trained from it: per model, column -> item id -> score."""
    from cascade.stages.train.context import ListSink, StageContext
    from cascade.stages.train.model_source import resolve_model_dir

    seed = run_seed(args.store, run_id)
    start = stage_checkpoint(args.store, run_id, args.start) if args.start else sft_checkpoint(args.store, run_id)
    start_dir = resolve_model_dir(start, work)
    stage = grpo_stage(base, args.domain, args.recipe).model_dump() | {"checkpoint_every": 0}
    stage |= {"steps": args.steps} if args.steps else {}
    stage |= {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    models: dict[str, dict] = {}
    for variant in args.variants:
        recipe = bench_recipe(
            base,
            stage | {"importance_correction": variant},
            argparse.Namespace(**vars(args), seed=seed),
            start_dir,
            f"file://{work / variant}",
            dtype=args.dtype,
        )
        cfg = recipe.stages[0]
        ctx = StageContext(
            recipe, Store.from_config(recipe.storage), "bench", f"runs/bench/00-{cfg.name}", ListSink(), workdir=work
        )
        trained = train_ours(cfg, ctx)
        models[variant] = {
            "scores": item_scores(recipe, trained["source"], args.domain),
            "mismatch": statistics.fmean(ctx.log.series("logprob_mismatch") or [math.nan]),
            "corrected": statistics.fmean(ctx.log.series("is_corrected") or [0.0]),
            "seconds": trained["seconds"],
        }
    models["start"] = {"scores": item_scores(recipe, str(start_dir), args.domain)}
    return models


def stage_checkpoint(store_root: str, run_id: str, stage: str) -> str:
    """The URI of the checkpoint the run's report lists for `stage`."""
    from cascade.artifacts.report import RunReport

    report = RunReport.load(Store(store_root), run_id)
    made = [s.checkpoint for s in (report.stages if report else []) if s.name == stage]
    if not made or not made[-1]:
        raise SystemExit(f"bench_importance: run {run_id!r} has no checkpoint of stage {stage!r}")
    return made[-1]


def run_seed(store_root: str, run_id: str) -> int:
    """The seed the run's stored recipe ran with."""
    from cascade.artifacts.layout import recipe_key

    return json.loads(Store(store_root).read_bytes(recipe_key(run_id)))["seed"]


def seed_row(models: dict, domain: str, variants: list[str]) -> dict[str, tuple[float, float | None]]:
    """column label -> paired (gain, SE): each variant over the start, and the last variant minus the first."""
    row = {}
    for column in (domain, ScoreColumn(domain, metric=GREEDY).key):
        for v in variants:
            row[f"{v} - start, {column}"] = paired_gain(models["start"]["scores"][column], models[v]["scores"][column])
        first, last = variants[0], variants[-1]
        if last != first:
            row[f"{last} - {first}, {column}"] = paired_gain(
                models[first]["scores"][column], models[last]["scores"][column]
            )
    return row


def across(values: list[float]) -> str:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:+.3f}"
    se = statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:+.3f} ± {se:.3f} ({mean / se:+.1f} SE)" if se else f"{mean:+.3f} ± 0"


def render(per_seed: dict[str, dict], args: argparse.Namespace) -> str:
    rows = {run: seed_row(models, args.domain, args.variants) for run, models in per_seed.items()}
    labels = list(next(iter(rows.values())))
    runs = list(rows)
    lines = ["| comparison | " + " | ".join(runs) + " | mean ± SE across seeds |", "|" + " --- |" * (len(runs) + 2)]
    for label in labels:
        cells = [format_gain(rows[r][label]) for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {across([rows[r][label][0] for r in runs])} |")
    for v in args.variants:
        mism = [per_seed[r][v]["mismatch"] for r in runs]
        corr = [per_seed[r][v]["corrected"] for r in runs]
        secs = [per_seed[r][v]["seconds"] for r in runs]
        lines.append(
            f"| {v}: mean logprob mismatch / corrected tokens / stage seconds | "
            + " | ".join(f"{m:.2e} / {c:.3f} / {s:.0f}" for m, c, s in zip(mism, corr, secs, strict=True))
            + " | |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="the store the runs are in, e.g. file://$CASCADE_HOME")
    parser.add_argument("--run-ids", nargs="+", required=True, help="runs with a committed SFT stage, one per seed")
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--domain", default="math")
    parser.add_argument("--split", choices=["dev", "heldout"], default="dev")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--variants", nargs="+", default=["none", "tis"], choices=["none", "tis", "mis"])
    parser.add_argument("--start", help="the stage whose checkpoint each run starts from; default: its SFT stage")
    parser.add_argument("--json", type=Path, help="also write each model's column means and every gain here")
    parser.add_argument("--steps", type=int, help="default: the stage's")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more stage settings, every variant")
    parser.add_argument("--eval-size", type=int, help="eval items; default: the domain's heldout_size")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    args.max_new_tokens = None  # bench_recipe's: the domain's own
    return args


def main(argv: list[str] | None = None) -> None:
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    base = load_recipe(args.recipe)
    per_seed = {}
    for run_id in args.run_ids:
        with TemporaryDirectory(prefix="bench-importance-") as tmp:
            per_seed[run_id] = train_variants(args, base, run_id, Path(tmp))
        print(f"{run_id}: done", flush=True)
    print(
        f"bench_importance: {args.recipe}'s GRPO stage on {args.domain} in {args.dtype}, variants "
        f"{', '.join(args.variants)}; eval {args.split}, paired over the same items"
    )
    print(render(per_seed, args))
    if args.json:
        means = {
            run: {name: {c: statistics.fmean(v.values()) for c, v in m["scores"].items()} for name, m in models.items()}
            for run, models in per_seed.items()
        }
        gains = {run: seed_row(models, args.domain, args.variants) for run, models in per_seed.items()}
        args.json.write_text(json.dumps({"means": means, "gains": gains}, indent=1))


if __name__ == "__main__":
    run_main(main)
