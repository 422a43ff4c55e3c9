"""IFEval's four numbers before and after a stage, with paired standard errors over prompts, from a run's evals.

    python bench/ifeval_gain.py STORE_RUN_DIR [--before source] [--after if_rl]

Reads `<run>/evals/NN-<before>.json` and `NN-<after>.json` (the records every eval writes: each IFEval prompt's
completion, prompt-level strict score and per-instruction verdicts) and prints, for prompt-level and
instruction-level accuracy, strict and loose: before, after, the paired gain and its SE. Prompt level: the mean of
per-prompt differences, SE = sd / sqrt(n). Instruction level: the instructions of one prompt move together, so
the SE treats each prompt as a cluster: gain = sum_i d_i / I, SE = sqrt(n) * sd(d_i) / I, with d_i the change in
prompt i's count of followed instructions and I the number of instructions. Any other benchmark column
(`bench/<name>`) is printed with its paired gain too.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

IFEVAL = "bench/ifeval"


def record(run_dir: Path, stage: str) -> dict:
    (path,) = [p for p in (run_dir / "evals").glob("*.json") if p.stem.split("-", 1)[1] == stage]
    return json.loads(path.read_text())


def rows_by_id(rec: dict, column: str) -> dict[str, dict]:
    return {r["id"]: r for r in rec["items"] if r["domain"] == column}


def paired(before: list[float], after: list[float], scale: float) -> tuple[float, float]:
    """(sum of differences / scale, its SE with each pair a unit)."""
    diffs = [a - b for a, b in zip(after, before, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1)) if n > 1 else 0.0
    return sum(diffs) / scale, math.sqrt(n) * sd / scale


def ifeval_rows(before: dict, after: dict) -> list[tuple[str, float, float, float, float]]:
    """(metric, before, after, gain, SE) for IFEval's four numbers, over the prompts both records hold."""
    old, new = rows_by_id(before, IFEVAL), rows_by_id(after, IFEVAL)
    ids = sorted(set(old) & set(new))
    out = []
    for level in ("prompt", "instruction"):
        for mode in ("strict", "loose"):
            if level == "prompt":
                per_old = [float(old[i]["details"][f"prompt_{mode}"]) for i in ids]
                per_new = [float(new[i]["details"][f"prompt_{mode}"]) for i in ids]
                scale = len(ids)
            else:
                per_old = [float(sum(v[mode] for v in old[i]["details"]["instructions"])) for i in ids]
                per_new = [float(sum(v[mode] for v in new[i]["details"]["instructions"])) for i in ids]
                scale = sum(len(old[i]["details"]["instructions"]) for i in ids)
            gain, se = paired(per_old, per_new, scale)
            out.append((f"{level}-level {mode}", sum(per_old) / scale, sum(per_new) / scale, gain, se))
    return out


def column_rows(before: dict, after: dict) -> list[tuple[str, float, float, float, float]]:
    """(column, before, after, gain, SE) for every other column both records score per item."""
    out = []
    for column in sorted({r["domain"] for r in after["items"]} - {IFEVAL}):
        old, new = rows_by_id(before, column), rows_by_id(after, column)
        ids = sorted(set(old) & set(new))
        if not ids:
            continue
        per_old = [float(old[i]["score"]) for i in ids]
        per_new = [float(new[i]["score"]) for i in ids]
        gain, se = paired(per_old, per_new, len(ids))
        out.append((column, sum(per_old) / len(ids), sum(per_new) / len(ids), gain, se))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a file store's runs/<id> directory")
    parser.add_argument("--before", default="source")
    parser.add_argument("--after", default="if_rl")
    args = parser.parse_args()
    before, after = record(args.run_dir, args.before), record(args.run_dir, args.after)
    rows = (ifeval_rows(before, after) if rows_by_id(after, IFEVAL) else []) + column_rows(before, after)
    print(f"| column | {args.before} | {args.after} | paired gain | in SE |")
    print("| --- | --- | --- | --- | --- |")
    for name, old, new, gain, se in rows:
        print(f"| {name} | {old:.3f} | {new:.3f} | {gain:+.3f} ± {se:.3f} | {gain / se if se else 0:+.1f} |")


if __name__ == "__main__":
    main()
