"""Learning parity: our GRPO stage and TRL's GRPOTrainer from one SFT checkpoint, on the same work, then evaluated.

    PYTHONPATH=. .venv/bin/python bench/bench_learning.py --store file://$HOME/.cascade --run-id RUN --out DIR \
        [--recipe tiny --domain math --split dev --steps 60 --prompts 8 --group 16 --eval-size 800]
    PYTHONPATH=. .venv/bin/python bench/bench_learning.py --checkpoint URI_OR_HF_DIR --out DIR ...

Both sides start from RUN's last committed SFT checkpoint (or --checkpoint) and run the recipe's GRPO stage on the
domain (tiny: math_rl) with the given overrides: ours is `stages.kinds.grpo.run_grpo.run_grpo` in this process, its
checkpoint in a scratch store; TRL 1.16's GRPOTrainer runs in .venv-trl (`bash bench/trl-venv.sh`;
bench/learning_trl_peer.py). They get the same prompts step by step (our stage's draw, handed to TRL in that order),
our grader as the reward, the same group size, temperature, top_p, max new tokens and steps, the same constant
learning rate, AdamW betas, weight decay and grad clip, no KL, no gradient checkpointing, fp32 on the CPU. Then the
SFT start, ours and TRL's are evaluated on the same items of the eval split with the same per-item seeds
(stages.evals.evaluate: the mean grade of k samples at the training temperature, greedy beside it), and paired
differences over items give each side's gain over SFT and ours - TRL, with standard errors. Printed: one table and the
verdict; --out gets rewards.png (both reward curves) and learning.json (settings, curves, per-item scores, gains).

Parity holds when ours gains at least as much as TRL's within one SE: ours - TRL >= -1 SE on the primary metric.
If TRL gains and ours does not, that is a bug to find, not a setting to tune. Settings are chosen on --split dev;
--split heldout is read once, for a recorded result.

Where the two sides necessarily differ:
- samples: our engine draws each row from a counter-based stream keyed by (seed, stage, step); TRL's HF `generate`
  from torch's global RNG seeded by --seed. The same distribution, different draws.
- flat groups: ours drops the groups whose rewards are all equal before the backward (`drop_flat_groups`, on in
  every shipped recipe), so its loss is normalized by the kept groups' completion tokens; TRL keeps them (zero
  advantage, no gradient) and counts their tokens, so its step is smaller by kept/all tokens before clipping and
  Adam's normalization. --keep-flat-groups runs ours as TRL does.
- the loss: TRL's loss_type "dapo" is the one whose normalizer is the global count of completion tokens, as in
  stages.train.losses.grpo_loss; its PPO clip never engages (one update per generation: ratio 1), as ours has none.
- advantages: (r - mean) / (std + eps) per group, with our std_eps (1e-6) against TRL's fixed 1e-4.
- top_p < 1 (1 in every shipped recipe): TRL trains on the full softmax's logprobs of tokens sampled from the
  nucleus; ours on the nucleus distribution's.
- weight decay (0 in every shipped GRPO stage): ours on every matrix, TRL's on every parameter but biases and
  norms: the same set for the Llama-family models here.
- seconds: ours includes committing its checkpoint; TRL's is `train()` alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections import defaultdict
from pathlib import Path
from tempfile import TemporaryDirectory

from bench_grpo import REPO, TRL_PYTHON, TRL_VENV, run_checked, run_main, trl_same_work_kwargs
from learning_table import plot_rewards, render, summarize

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.recipe.schema import Recipe, load_recipe, validate_recipe


def grpo_stage(recipe: Recipe, domain: str, recipe_name: str) -> GRPOConfig:
    """The recipe's first GRPO stage that trains `domain` alone (its prompts, sizes and settings are the bench's)."""
    for stage in recipe.stages:
        if stage.kind == "grpo" and stage.domains == [domain]:
            return stage
    raise SystemExit(f"bench_learning: recipe {recipe_name!r} has no GRPO stage on {domain!r} alone")


def unsupported(cfg: GRPOConfig) -> list[str]:
    """What of our stage GRPOTrainer cannot be given the same: the bench refuses it rather than compare other work."""
    reasons = []
    if isinstance(cfg.prompts, str):
        reasons.append(f"prompts from difficulty stage {cfg.prompts!r} (the bench runs no earlier stage)")
    if cfg.reward.kind != "grader":
        reasons.append(f"a {cfg.reward.kind} reward (the peer scores with the domain's grader)")
    if cfg.refill_rounds:
        reasons.append("refill_rounds (TRL draws no prompts beyond a step's P)")
    if cfg.kl_coef:
        reasons.append("kl_coef (the bench compares the KL-free objective, beta=0)")
    if cfg.warmup_steps:
        reasons.append("warmup_steps (TRL's warm-up takes its first step at lr 0, ours at lr / warmup_steps)")
    return reasons


def trl_config_kwargs(cfg: GRPOConfig, max_new_tokens: int, seed: int) -> dict:
    """GRPOConfig keyword arguments (TRL 1.16, all but output_dir) for the work of our stage `cfg`."""
    return {
        **trl_same_work_kwargs(
            cfg.prompts_per_step,
            cfg.group_size,
            max_new_tokens,
            cfg.steps,
            cfg.lr,
            seed,
            "fp32",
            cfg.temperature,
            cfg.top_p,
        ),
        # our GRPO stage steps at cfg.lr from its first step to its last (a warm-up is refused above), no decay
        "lr_scheduler_type": "constant",
        "optim": "adamw_torch_fused",  # stages.train.training.make_optimizer: torch's fused AdamW
        "adam_beta1": cfg.adam_betas[0],
        "adam_beta2": cfg.adam_betas[1],
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.grad_clip,
        # the sum over every completion token of the batch divided by their global count, as grpo_loss; "bnpo"
        # divides by the local batch's count (the same in one process, not under data parallelism), "grpo"
        # averages each sequence first (a length bias ours does not have)
        "loss_type": "dapo",
        "scale_rewards": "group",  # (r - mean) / std within each prompt's group, as losses.grpo_advantages
        "shuffle_dataset": False,  # the dataset is our stage's prompts in step order
    }


def stage_settings(base: GRPOConfig, args: argparse.Namespace) -> dict:
    """The bench's stage: the recipe's, with the command line's overrides, no step checkpoints."""
    overrides = {
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "group_size": args.group,
        "lr": args.lr,
        "temperature": args.temperature,
        "drop_flat_groups": False if args.keep_flat_groups else None,
    }
    return base.model_dump() | {"checkpoint_every": 0} | {k: v for k, v in overrides.items() if v is not None}


def bench_recipe(
    base: Recipe, stage: dict, args: argparse.Namespace, sft_dir: Path, store_root: str, dtype: str = "fp32"
) -> Recipe:
    """A one-stage recipe: the stage on the SFT model on the CPU (fp32 unless told), the domain alone with the
    bench's eval split, eval size and completion length, a scratch store, the HF engine."""
    domain = base.domains[args.domain].model_dump() | {
        "heldout_size": args.eval_size or base.domains[args.domain].heldout_size,
        "max_new_tokens": args.max_new_tokens or base.domains[args.domain].max_new_tokens,
    }
    return validate_recipe(
        {
            "name": "bench-learning",
            "seed": base.seed if args.seed is None else args.seed,
            "model": {"source": str(sft_dir)},
            "storage": {"root": store_root},
            "engine": {"kind": "hf", "batch_size": base.engine.batch_size},
            "compute": {"device": "cpu", "dtype": dtype},
            "domains": {args.domain: domain},
            "stages": [stage],
            "eval": {"split": args.split},
        },
        "bench_learning",
    )


def sft_checkpoint(store_root: str, run_id: str) -> str:
    """The URI of the run's last committed SFT checkpoint, as its report lists it (bench_recovery reads it so)."""
    store = Store(store_root)
    report = RunReport.load(store, run_id)
    if report is None:
        raise SystemExit(f"bench_learning: no run {run_id!r} in {store_root}")
    made = [s.checkpoint for s in report.stages if s.kind == "sft" and s.checkpoint]
    made = [uri for uri in made if store.key_of(uri) is not None and committed(store, store.key_of(uri))]
    if not made:
        raise SystemExit(f"bench_learning: run {run_id!r} has no committed SFT checkpoint")
    return made[-1]


def prompt_schedule(cfg: GRPOConfig, ctx) -> list[list]:
    """The prompts of each of our stage's steps, in order: its pool and its per-step draw (stages.train.rollout)."""
    from cascade.stages.kinds import StageInputs
    from cascade.stages.kinds.grpo.run_grpo import train_prompts
    from cascade.stages.train.rollout import step_prompts

    pool = train_prompts(cfg, ctx, StageInputs())
    return [step_prompts(pool, cfg, ctx.recipe.seed, step) for step in range(cfg.steps)]


def train_ours(cfg: GRPOConfig, ctx) -> dict:
    """Our stage from the recipe's model source (the SFT model); its checkpoint goes to the scratch store."""
    from cascade.stages.kinds import StageInputs, run_stage

    started = time.perf_counter()
    result = run_stage(cfg, ctx, StageInputs())
    return {
        "steps": cfg.steps,
        "seconds": time.perf_counter() - started,
        "reward": ctx.log.series("reward"),
        "source": result.checkpoint.uri,
    }


def train_trl(cfg: GRPOConfig, recipe: Recipe, schedule: list[list], threads: int, work: Path) -> dict:
    """TRL's GRPOTrainer on the same work, in .venv-trl; its model is an HF directory under `work`."""
    domain = cfg.domains[0]
    job = {
        "model_dir": recipe.model.source,
        "out_dir": str(work / "trl"),
        "domain": domain,
        "options": recipe.domains[domain].options,
        "threads": threads,
        "config": trl_config_kwargs(cfg, recipe.domains[domain].max_new_tokens, recipe.seed),
        "schedule": [[dataclasses.asdict(item) for item in step] for step in schedule],
    }
    (work / "trl-job.json").write_text(json.dumps(job))  # a step list too long for a command line
    run_checked(
        [str(TRL_PYTHON), str(REPO / "bench" / "learning_trl_peer.py"), str(work / "trl-job.json")],
        threads,
        "bench_learning: the TRL run",
    )
    done = json.loads((work / "trl" / "trl.json").read_text())
    return {
        "steps": cfg.steps,
        "seconds": done["seconds"],
        "reward": done["reward"],
        "source": str(work / "trl" / "model"),
    }


def item_scores(recipe: Recipe, source: str, domain: str) -> dict[str, dict[str, float]]:
    """column -> item id -> score of one model (an HF dir or a checkpoint URI) on the recipe's eval split: every
    model gets the same items and, per item, the same sampling seed (stages.evals.evaluate.item_seeds)."""
    from cascade.stages.evals.evaluate import evaluate_domains, open_policy

    scored = recipe.model_copy(update={"model": recipe.model.model_copy(update={"source": source})})
    tokenizer, engine = open_policy(scored)
    try:
        _, rows = evaluate_domains(engine, tokenizer, scored, [domain])
    finally:
        engine.close()
    scores: dict[str, dict[str, float]] = defaultdict(dict)
    for row in rows:
        scores[row["domain"]][row["id"]] = row["score"]
    return dict(scores)


def run(args: argparse.Namespace, base: Recipe, stage: dict, work: Path) -> tuple[dict, Recipe]:
    """Both sides trained and all three models scored; sides: name -> its curve, seconds and per-item scores."""
    import torch

    from cascade.stages.errors import ModelSourceError
    from cascade.stages.train.context import ListSink, StageContext
    from cascade.stages.train.model_source import resolve_model_dir

    torch.set_num_threads(args.threads)
    source = args.checkpoint or sft_checkpoint(args.store, args.run_id)
    try:
        sft_dir = resolve_model_dir(source, work)
    except ModelSourceError as e:
        raise SystemExit(f"bench_learning: {e}") from None
    if sft_dir is None:
        raise SystemExit("bench_learning: --checkpoint tiny is an untrained model; give an SFT checkpoint")
    recipe = bench_recipe(base, stage, args, sft_dir, f"file://{work / 'store'}")
    cfg = recipe.stages[0]
    ctx = StageContext(
        recipe,
        Store.from_config(recipe.storage),
        "bench-learning",
        f"runs/bench-learning/00-{cfg.name}",
        ListSink(),
        workdir=work,
    )
    sides = {
        "sft": {"source": str(sft_dir)},
        "ours": train_ours(cfg, ctx),
        "trl": train_trl(cfg, recipe, prompt_schedule(cfg, ctx), args.threads, work),
    }
    for side in sides.values():
        side["scores"] = item_scores(recipe, side["source"], args.domain)
    return sides, recipe


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    start = parser.add_mutually_exclusive_group(required=True)
    start.add_argument("--run-id", help="a run whose SFT stage is committed (with --store)")
    start.add_argument("--checkpoint", help="the SFT checkpoint: a store URI, a checkpoint dir or an HF model dir")
    parser.add_argument("--store", help="the store RUN is in, e.g. file://$HOME/.cascade")
    parser.add_argument("--recipe", default="tiny", help="the domains, eval sizes and GRPO stage (default tiny)")
    parser.add_argument("--domain", default="math")
    parser.add_argument("--steps", type=int, help="default: the recipe's GRPO stage on the domain")
    parser.add_argument("--prompts", type=int, help="prompts per step; default: the stage's")
    parser.add_argument("--group", type=int, help="samples per prompt; default: the stage's")
    parser.add_argument("--lr", type=float, help="default: the stage's")
    parser.add_argument("--temperature", type=float, help="default: the stage's (the eval samples at it too)")
    parser.add_argument("--max-new-tokens", type=int, help="default: the domain's")
    parser.add_argument(
        "--split",
        choices=["dev", "heldout"],
        default="dev",
        help="eval split: dev to tune settings, heldout once for a recorded result",
    )
    parser.add_argument("--eval-size", type=int, help="eval items; default: the domain's heldout_size")
    parser.add_argument("--seed", type=int, help="the recipe seed (prompt draws, samples, eval items); default its")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of each side")
    parser.add_argument(
        "--keep-flat-groups",
        action="store_true",
        help="ours keeps groups whose rewards are all equal, as TRL does (drop_flat_groups: false)",
    )
    parser.add_argument("--out", type=Path, required=True, help="where rewards.png and learning.json go")
    args = parser.parse_args(argv)
    if args.run_id and not args.store:
        parser.error("--run-id needs --store")
    for name in ("steps", "prompts", "group", "max_new_tokens", "eval_size", "threads"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    base = load_recipe(args.recipe)
    if args.domain not in base.domains:
        raise SystemExit(f"bench_learning: recipe {args.recipe!r} has no domain {args.domain!r}")
    stage = stage_settings(grpo_stage(base, args.domain, args.recipe), args)
    refused = unsupported(GRPOConfig.model_validate(stage))
    if refused:
        raise SystemExit(f"bench_learning: stage {stage['name']!r} has {'; '.join(refused)}")
    if not TRL_PYTHON.exists():
        raise SystemExit(f"bench_learning: no TRL venv at {TRL_VENV}: build it with `bash bench/trl-venv.sh`")
    with TemporaryDirectory(prefix="bench-learning-") as tmp:
        sides, recipe = run(args, base, stage, Path(tmp))
    summary = summarize(sides, args.domain)
    cfg = recipe.stages[0]
    print(
        f"bench_learning: {cfg.name} on {args.domain}, {cfg.steps} steps x {cfg.prompts_per_step} prompts x "
        f"{cfg.group_size} samples, lr {cfg.lr}, temperature {cfg.temperature}, "
        f"{recipe.domains[args.domain].max_new_tokens} new tokens; eval {args.split} "
        f"{recipe.domains[args.domain].heldout_size} items, {recipe.eval_sampling(args.domain)[1]} samples each"
    )
    print(render(sides, summary))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_rewards(sides, f"{cfg.name} on {args.domain}: ours vs TRL GRPOTrainer", args.out / "rewards.png")
    record = {
        "settings": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "stage": cfg.model_dump(),
            "trl_config": trl_config_kwargs(cfg, recipe.domains[args.domain].max_new_tokens, recipe.seed),
        },
        "sides": {name: {k: v for k, v in side.items() if k != "source"} for name, side in sides.items()},
        "summary": summary,
    }
    (args.out / "learning.json").write_text(json.dumps(record, indent=1))
    print(f"wrote {args.out / 'rewards.png'} and {args.out / 'learning.json'}")


if __name__ == "__main__":
    run_main(main)
