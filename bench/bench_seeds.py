"""Each RL stage's gain across seeds: the training variance that one run's paired standard error leaves out.

    .venv/bin/python bench/bench_seeds.py tiny [--first-seed S] [--seeds 5] [--home DIR] [key=value ...]

Runs `cascade run RECIPE seed=S --run-id seeds-<recipe>-<S>` for S = first_seed .. first_seed + seeds - 1, one
after another (a run of that id that already finished is read, not run again; one that stopped is resumed), in
CASCADE_HOME (--home, default: the current one). From each run's eval records it takes every RL stage's paired
gain on its own domains (the primary metric and greedy, as `cascade report` prints them), then prints per stage
and domain each seed's gain, the mean over seeds and its standard error across seeds: sd(gains) / sqrt(N). A
stage "gains" when the mean exceeds t SE, t the two-sided 95% quantile of Student's t with N - 1 degrees of
freedom (4.30 for 3 seeds, 2.78 for 5; 2 only as N grows large); where greedy does not move while the sampled
metric does, the stage sharpens sampling rather than adding capability, and the policy's entropy at the start and
end of each RL stage (printed last, from the runs' step logs) shows it. The recorded results use seeds that appear
nowhere in the repository: without --first-seed the seeds are drawn at random (from 10^6 to 10^9) until no file
git tracks names any of them as a word, and the script says which it drew, so that a recorded table never reads
the seeds the recipe was tuned on.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cascade.artifacts.html_report import Gain, item_scores, stage_gains
from cascade.artifacts.layout import report_key
from cascade.artifacts.report import RunReport
from cascade.artifacts.steplog import read_run
from cascade.artifacts.store import Store
from cascade.flows.recipes import load_recipe
from cascade.stages.kinds import gain_targets


@dataclass(frozen=True)
class AcrossSeeds:
    """One stage's gain on one column (a domain, or greedy/<domain>) over seeds: each seed's paired gain, their
    mean and the standard error of that mean across seeds (None under two seeds)."""

    stage: str
    domain: str
    gains: tuple[float, ...]
    mean: float
    se: float | None

    @property
    def in_se(self) -> float | None:
        return self.mean / self.se if self.se else None

    @property
    def t_bar(self) -> float | None:
        """How many SE the mean must clear: Student's t, two-sided 95%, with N - 1 degrees of freedom."""
        from scipy.stats import t

        return float(t.ppf(0.975, len(self.gains) - 1)) if len(self.gains) > 1 else None

    @property
    def clears_bar(self) -> bool | None:
        return abs(self.in_se) > self.t_bar if self.in_se is not None else None


def across_seeds(per_seed: list[list[Gain]]) -> list[AcrossSeeds]:
    """The gains of each (stage, column) that every seed's run has, in the first run's order."""
    keyed = [{(g.stage, g.domain): g.gain for g in gains} for gains in per_seed]
    rows = []
    for g in per_seed[0] if per_seed else []:
        values = tuple(run[(g.stage, g.domain)] for run in keyed if (g.stage, g.domain) in run)
        if len(values) < len(keyed):
            continue
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
        rows.append(AcrossSeeds(g.stage, g.domain, values, statistics.fmean(values), se))
    return rows


def run_gains(store: Store, run_id: str, recipe) -> list[Gain]:
    """A finished run's paired gains of each RL stage on its own domains, as `cascade report` prints them."""
    _, rows = RunReport.load(store, run_id).forgetting_matrix()
    return stage_gains([stage for stage, _ in rows], item_scores(store, run_id), gain_targets(recipe.stages))


ENTROPY_ENDS = 10  # steps averaged at each end of an RL stage's entropy curve


def entropy_ends(store: Store, run_id: str, stages: list[str]) -> dict[str, tuple[float, float]]:
    """stage -> the policy's mean token entropy over its first and its last ENTROPY_ENDS steps, for each of
    `stages` that logged entropy: a stage that sharpens sampling lowers it."""
    ends = {}
    for stage, rows in read_run(store, run_id).items():
        curve = [row["metrics"]["entropy"] for row in rows if "entropy" in row["metrics"]]
        if stage in stages and curve:
            ends[stage] = (statistics.fmean(curve[:ENTROPY_ENDS]), statistics.fmean(curve[-ENTROPY_ENDS:]))
    return ends


def entropy_table(per_seed: list[dict[str, tuple[float, float]]], seeds: list[int]) -> str:
    lines = [
        f"| stage | {' | '.join(f'seed {s}' for s in seeds)} |",
        "|" + " --- |" * (len(seeds) + 1),
    ]
    for stage in per_seed[0] if per_seed else {}:
        cells = [f"{run[stage][0]:.2f} -> {run[stage][1]:.2f}" if stage in run else "-" for run in per_seed]
        lines.append(f"| {stage} | {' | '.join(cells)} |")
    return "\n".join(lines)


def ensure_run(recipe_name: str, seed: int, overrides: list[str], env: dict[str, str]) -> str:
    """The run of this seed, run (or resumed) here unless it finished already; its id."""
    run_id = f"seeds-{recipe_name}-{seed}".lower()
    recipe = load_recipe(recipe_name, [f"seed={seed}", *overrides])
    store = Store.from_config(recipe.storage)
    report = RunReport.load(store, run_id) if store.exists(report_key(run_id)) else None
    if report is not None and report.status == "FINISHED":
        return run_id
    command = ["resume", run_id] if report is not None else ["run", recipe_name, f"seed={seed}", *overrides]
    if report is None:
        command += ["--run-id", run_id]
    print(f"seed {seed}: cascade {' '.join(command)}", flush=True)
    subprocess.run([sys.executable, "-m", "cascade.flows.cli", *command], env=env, check=True)
    return run_id


def table(rows: list[AcrossSeeds], seeds: list[int]) -> str:
    head = ["stage", "domain", *(f"seed {s}" for s in seeds), "mean ± SE across seeds", "in SE", "t bar", "clears it"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        mean = f"{r.mean:+.3f} ± {r.se:.3f}" if r.se else f"{r.mean:+.3f}"
        in_se = f"{r.in_se:+.1f}" if r.in_se is not None else "-"
        bar = f"{r.t_bar:.2f}" if r.t_bar is not None else "-"
        clears = {True: "yes", False: "no", None: "-"}[r.clears_bar]
        cells = [r.stage, r.domain, *(f"{g:+.3f}" for g in r.gains), mean, in_se, bar, clears]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def unused_first_seed(count: int, named: Callable[[int], bool], rng: random.Random) -> int:
    """A first seed S such that no seed of S .. S + count - 1 is `named` (by a file the repository tracks)."""
    for _ in range(1000):
        first = rng.randrange(10**6, 10**9)
        if not any(named(seed) for seed in range(first, first + count)):
            return first
    raise RuntimeError("1000 draws in a row named a seed: pass --first-seed")


def named_in_repository(seed: int) -> bool:
    """Whether any file git tracks holds the seed as a word."""
    found = subprocess.run(["git", "grep", "-q", "-w", str(seed)], cwd=Path(__file__).resolve().parents[1])
    return found.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides, the same for every seed")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--first-seed", type=int, default=None, help="the first seed; default: drawn so that no tracked file names any"
    )
    parser.add_argument("--home", type=Path, default=None, help="CASCADE_HOME of the runs")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.home is not None:
        env["CASCADE_HOME"] = os.environ["CASCADE_HOME"] = str(args.home)
    first = args.first_seed
    if first is None:
        first = unused_first_seed(args.seeds, named_in_repository, random.Random())
        print(f"seeds {first}-{first + args.seeds - 1}: drawn at random; no file the repository tracks names them")
    seeds = list(range(first, first + args.seeds))
    per_seed, entropies = [], []
    for seed in seeds:
        run_id = ensure_run(args.recipe, seed, args.overrides, env)
        recipe = load_recipe(args.recipe, [f"seed={seed}", *args.overrides])
        store = Store.from_config(recipe.storage)
        per_seed.append(run_gains(store, run_id, recipe))
        entropies.append(entropy_ends(store, run_id, sorted(gain_targets(recipe.stages))))
    print(f"\n{args.recipe}, seeds {seeds[0]}-{seeds[-1]}: each RL stage's paired gain on its own domains")
    print(table(across_seeds(per_seed), seeds))
    print(f"\nthe policy's mean token entropy, first {ENTROPY_ENDS} steps -> last {ENTROPY_ENDS}")
    print(entropy_table(entropies, seeds))


if __name__ == "__main__":
    main()
