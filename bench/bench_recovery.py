"""Recovering a regressed domain: MOPD from the best-per-domain teachers vs continuing GRPO on that domain.

    PYTHONPATH=. .venv/bin/python bench/bench_recovery.py --store file://$HOME/.cascade --run-id RUN \
        [--steps 50 --every 5] [--split dev] [--methods mopd,grpo] [--mopd lr=3e-4 --mopd group_size=8]

RUN is a finished `cascade run tiny-regression` whose gate fired. Both methods start from the checkpoint the
gate fired on: MOPD with the recipe's `gate.recovery` settings and the teachers the gate chose (the best stage
per domain), GRPO with the recipe's GRPO defaults on the regressed domain only. Each runs `--steps` steps with a
step checkpoint every `--every`; every step checkpoint is then evaluated on all domains. The table gives, per
method, the first step at which the regressed domain is back within tolerance of its best, the training wall
time to that step (evals excluded), and the scores at the last step (the other domains show what recovery
costs the new stage's gain).
"""

from __future__ import annotations

import argparse
import time

import yaml

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.layout import recipe_key, step_key
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.stages.evals.evaluate import evaluate_model
from cascade.stages.evals.gate import best_stages
from cascade.stages.kinds import run_stage
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.walk import Made
from cascade.stages.train.context import ListSink, StageContext, stage_workdir


class TimedSink(ListSink):
    """Metric rows plus the wall time at which each step finished."""

    def __init__(self) -> None:
        super().__init__()
        self.times: dict[int, float] = {}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        super().log(step, metrics)
        self.times[step] = time.time()


def recovery_configs(
    recipe: Recipe, domain: str, teachers: dict[str, str], steps: int, every: int, mopd_overrides: dict[str, str]
):
    common = {"steps": steps, "checkpoint_every": every, "keep_step_checkpoints": steps}  # curve() reads them all
    fields = recipe.gate.recovery.model_dump() | mopd_overrides | {"name": "bench-mopd", "teachers": teachers, **common}
    mopd = type(recipe.gate.recovery).model_validate(fields)  # validated: a typo in --mopd is an error, not ignored
    grpo = GRPOConfig(name="bench-grpo", domains=[domain], **common)
    return {"mopd": mopd, "grpo": grpo}


def curve(ctx: StageContext, steps: int, every: int) -> dict[int, dict[str, float]]:
    """Held-out scores of every step checkpoint (and the final one)."""
    scores = {}
    for step in range(every, steps + 1, every):
        key = ctx.key if step == steps else step_key(ctx.key, step)
        scores[step] = evaluate_model(ctx.recipe, committed(ctx.store, key), ctx.store)[0]
    return scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--split", choices=["heldout", "dev"], default="heldout")
    ap.add_argument("--methods", default="mopd,grpo")
    ap.add_argument("--tag", default="", help="suffix of the bench's checkpoint folder, so variants run side by side")
    ap.add_argument(
        "--mopd",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of gate.recovery, e.g. lr=3e-4 or domains=[math] (YAML values)",
    )
    args = ap.parse_args()
    store = Store(args.store)
    recipe = Recipe.model_validate_json(store.read_bytes(recipe_key(args.run_id)))
    recipe = recipe.model_copy(update={"eval": recipe.eval.model_copy(update={"split": args.split})})
    mopd_overrides = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.mopd)}
    report = RunReport.load(store, args.run_id)
    fired = [g for g in report.gate if g.action == "recover"]
    if not fired:
        raise SystemExit(f"run {args.run_id}: the gate did not fire; nothing to recover")
    stage, domain = fired[0].stage, fired[0].domain
    best, tolerance = fired[0].best, fired[0].tolerance
    teachers = best_stages(report.evals_through(stage), list(recipe.domains))
    made = {s.name: committed(store, store.key_of(s.checkpoint)) for s in report.stages if s.checkpoint}
    student = made[stage]
    print(
        f"{stage} dropped {domain} from {best:.3f} to {fired[0].now:.3f} (tolerance {tolerance}); teachers {teachers}"
    )
    if args.split == "dev":
        best = evaluate_model(recipe, made[teachers[domain]], store)[0][domain]
        start = evaluate_model(recipe, student, store)[0][domain]
        print(f"dev split: {domain} {best:.3f} for the teacher {teachers[domain]}, {start:.3f} for {stage}")
    configs = recovery_configs(recipe, domain, teachers, args.steps, args.every, mopd_overrides)
    rows = []
    for method in args.methods.split(","):
        cfg = configs[method]
        sink = TimedSink()
        started = time.time()
        with stage_workdir() as workdir:
            key = f"bench/recovery/{args.run_id}/{method}{args.tag}"
            ctx = StageContext(recipe, store, f"bench-{args.run_id}", key, sink, workdir=workdir)
            run_stage(cfg, ctx, Made(stages=made, policy=student).inputs(cfg))
        scores = curve(ctx, args.steps, args.every)
        back = [s for s, sc in scores.items() if sc[domain] >= best - tolerance]
        first = back[0] if back else None
        rows.append(
            (
                method,
                first,
                round(sink.times[first] - started, 1) if first else None,
                scores[args.steps],
                {s: round(sc[domain], 3) for s, sc in scores.items()},
            )
        )
    print(
        f"\n| method | steps to within {tolerance} of {best:.3f} ({domain}) | train s to it | "
        f"scores at step {args.steps} | {domain} per step |"
    )
    print("| --- | --- | --- | --- | --- |")
    for method, first, seconds, final, per_step in rows:
        print(
            f"| {method} | {first or 'not within ' + str(args.steps)} | {seconds or '-'} | "
            f"{ {d: round(v, 3) for d, v in final.items()} } | {per_step} |"
        )


if __name__ == "__main__":
    main()
