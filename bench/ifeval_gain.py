"""IFEval's four numbers before and after a stage, with paired standard errors over prompts, from a run's evals.

    python bench/ifeval_gain.py STORE_RUN_DIR [--before source] [--after if_rl]

Reads `<run>/evals/NN-<before>.json` and `NN-<after>.json` (the records every eval writes: each IFEval prompt's
completion, prompt-level strict score and per-instruction verdicts) and prints, for prompt-level and
instruction-level accuracy, strict and loose: before, after, the paired gain and its SE. Prompt level: the mean of
per-prompt differences, SE = sd / sqrt(n). Instruction level: the instructions of one prompt move together, so
the SE treats each prompt as a cluster: gain = sum_i d_i / I, SE = sqrt(n) * sd(d_i) / I, with d_i the change in
prompt i's count of followed instructions and I the number of instructions. Any other benchmark column
(`bench/<name>`) is printed with its paired gain too.

Two breakdowns of where an IFEval gain comes from follow:
- per instruction type (`detectable_format:title`, ...): the strict verdicts of that type's instructions before
  and after, the paired gain over them and its SE (instructions as units);
- by the token cap: the share of answers that ran to max_new_tokens (finish_reason "length": most are loops)
  before and after, and the prompt-level strict gain on the prompts whose answers stopped on their own both times
  (the gain in constraints followed, not in answers that stopped looping) beside the one on the rest.
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


def type_rows(before: dict, after: dict) -> list[tuple[str, int, float, float, float, float]]:
    """(instruction type, instructions, before, after, gain, SE) of strict verdicts, most instructions first."""
    old, new = rows_by_id(before, IFEVAL), rows_by_id(after, IFEVAL)
    pairs: dict[str, tuple[list[float], list[float]]] = {}
    for i in sorted(set(old) & set(new)):
        for was, now in zip(old[i]["details"]["instructions"], new[i]["details"]["instructions"], strict=True):
            kept = pairs.setdefault(was["id"], ([], []))
            kept[0].append(float(was["strict"]))
            kept[1].append(float(now["strict"]))
    out = []
    for kind, (was, now) in sorted(pairs.items(), key=lambda kv: (-len(kv[1][0]), kv[0])):
        gain, se = paired(was, now, len(was))
        out.append((kind, len(was), sum(was) / len(was), sum(now) / len(now), gain, se))
    return out


def cap_rows(before: dict, after: dict) -> list[tuple[str, int, float, float, float, float]] | None:
    """(prompts, count, strict before, after, gain, SE) on the prompts answered within the cap both times and on
    the rest, then the capped share (as before/after); None where a record holds no finish reasons."""
    old, new = rows_by_id(before, IFEVAL), rows_by_id(after, IFEVAL)
    ids = sorted(set(old) & set(new))
    if not ids or any("finish_reason" not in r[i] for r in (old, new) for i in ids):
        return None
    capped = {i: (old[i]["finish_reason"] == "length", new[i]["finish_reason"] == "length") for i in ids}
    out = []
    for label, chosen in (
        ("stopped both times", [i for i in ids if not any(capped[i])]),
        ("capped before or after", [i for i in ids if any(capped[i])]),
    ):
        if chosen:
            was = [float(old[i]["details"]["prompt_strict"]) for i in chosen]
            now = [float(new[i]["details"]["prompt_strict"]) for i in chosen]
            gain, se = paired(was, now, len(chosen))
            out.append((label, len(chosen), sum(was) / len(was), sum(now) / len(now), gain, se))
    was = [float(capped[i][0]) for i in ids]
    now = [float(capped[i][1]) for i in ids]
    gain, se = paired(was, now, len(ids))
    out.append(("share capped (not a score)", len(ids), sum(was) / len(ids), sum(now) / len(ids), gain, se))
    return out


def print_table(header: str, rows: list[tuple]) -> None:
    print(f"\n| {header} | n | before | after | paired gain | in SE |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, n, old, new, gain, se in rows:
        print(f"| {name} | {n} | {old:.3f} | {new:.3f} | {gain:+.3f} ± {se:.3f} | {gain / se if se else 0:+.1f} |")


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
    if not rows_by_id(after, IFEVAL):
        return
    print_table("instruction type (strict)", type_rows(before, after))
    capped = cap_rows(before, after)
    if capped is None:
        print("\n(no finish reasons in these records: evals written before they were stored)")
    else:
        print_table("IFEval prompts (prompt-level strict)", capped)


if __name__ == "__main__":
    main()
