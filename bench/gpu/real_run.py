"""A real recipe on one machine, scored before and after: the stage driver's run, the flow's evals, the paired table.

    python bench/gpu/real_run.py RECIPE --store DIR --run-id ID [key=value ...] [--json FILE]

Runs the recipe's stages through the stage driver (`cascade.stages.run.run_stages`: the flow's stage code without
Prefect or MLflow), then evaluates the model source and every policy stage's checkpoint with the flow's own eval
(`stages.evals.evaluate.evaluate_model`: each domain's eval split and each `eval.benchmarks` column, graded by the
domain's one grader), and writes each as the flow's eval record (`runs/<id>/evals/NN-<stage>.json`), so
bench/ifeval_gain.py reads them as it reads a flow's run. Printed per policy stage, against the source: IFEval's
four numbers and every other column's mean, with the paired gain over the items both scored and its standard error.
An eval whose record is already there for the same checkpoint digest is read back, not redone.

It is what bench/gpu/check.sh runs for the real recipes on a lent GPU (torch and transformers alone there).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: ifeval_gain's paired rows
from ifeval_gain import IFEVAL, column_rows, ifeval_rows, rows_by_id  # noqa: E402

from cascade.artifacts import layout  # noqa: E402
from cascade.artifacts.checkpoint import CheckpointRef, adoptable  # noqa: E402
from cascade.artifacts.store import Store  # noqa: E402
from cascade.stages.kinds import kind_of  # noqa: E402
from cascade.stages.recipe.config_base import SOURCE_EVAL  # noqa: E402
from cascade.stages.recipe.schema import Recipe, load_recipe  # noqa: E402
from cascade.stages.run import run_stages  # noqa: E402


def policy_checkpoints(recipe: Recipe, store: Store, run_id: str) -> list[tuple[int, str, CheckpointRef]]:
    """(index, stage name, committed checkpoint) of every policy stage of the run, in order."""
    found = []
    for index, cfg in enumerate(recipe.stages):
        if kind_of(cfg.kind).makes != "policy":
            continue
        ref, why = adoptable(store, layout.stage_key(run_id, index, cfg.name))
        if ref is None:
            raise SystemExit(f"real_run: stage {cfg.name!r} of run {run_id!r} has no committed checkpoint ({why})")
        found.append((index, cfg.name, ref))
    return found


def evaluated(recipe: Recipe, store: Store, run_id: str, index: int, stage: str, ref: CheckpointRef | None) -> dict:
    """The eval record of one model (None: the source), as the flow writes it; reused when its digest matches."""
    from cascade.stages.evals.evaluate import stored_or_evaluated

    started = time.time()
    record, new = stored_or_evaluated(recipe, store, layout.eval_key(run_id, index, stage), ref)
    if new:
        print(f"[eval {stage}] {time.time() - started:.1f} s: {json.dumps(record.scores)}", file=sys.stderr, flush=True)
    return json.loads(record.to_json())


def gain_table(before: dict, after: dict, stage: str) -> tuple[str, list[dict]]:
    """Markdown of each column's source and after-stage means, paired gain and SE; the same as rows."""
    rows = (ifeval_rows(before, after) if rows_by_id(after, IFEVAL) else []) + column_rows(before, after)
    lines = [f"| column | {SOURCE_EVAL} | {stage} | paired gain | in SE |", "| --- | --- | --- | --- | --- |"]
    out = []
    for name, old, new, gain, se in rows:
        lines.append(f"| {name} | {old:.3f} | {new:.3f} | {gain:+.3f} ± {se:.3f} | {gain / se if se else 0:+.1f} |")
        out.append({"column": name, "before": old, "after": new, "gain": gain, "se": se})
    return "\n".join(lines), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. compute.device=cuda")
    parser.add_argument("--store", required=True, type=Path, help="a directory: the run's file store")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--json", type=Path, help="write the stages' summaries, eval scores and tables here")
    args = parser.parse_intermixed_args(argv)
    recipe = load_recipe(args.recipe, [f"storage.root=file://{args.store.resolve()}", *args.overrides])
    store = Store.from_config(recipe.storage)
    started = time.time()
    summary = run_stages(recipe, args.run_id, log_every=args.log_every)
    for outcome in summary.values():
        outcome.pop("steps", None)  # each step's metrics stay in the run's step logs
    before = evaluated(recipe, store, args.run_id, 0, SOURCE_EVAL, None)
    result = {"recipe": args.recipe, "overrides": args.overrides, "stages": summary, "evals": {}, "gains": {}}
    result["evals"][SOURCE_EVAL] = before["scores"]
    for index, stage, ref in policy_checkpoints(recipe, store, args.run_id):
        after = evaluated(recipe, store, args.run_id, index, stage, ref)
        result["evals"][stage] = after["scores"]
        table, rows = gain_table(before, after, stage)
        result["gains"][stage] = rows
        print(f"\n{args.recipe}: {stage} against the source ({len(before['items'])} items scored)\n{table}")
    result["seconds"] = round(time.time() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
