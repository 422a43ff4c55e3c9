"""Step time of `micro`'s SFT stage under each launcher: in-process, torchrun with 2 ranks, Ray with 2 workers.

    PYTHONPATH=. .venv/bin/python bench/bench_scale.py                  # 30 steps each, 3 rounds
    PYTHONPATH=. .venv/bin/python bench/bench_scale.py --steps 60 --rounds 5

One SFT dataset is built once; then, per round and in rotating order, the same SFT stage (micro's model and
rows, `--steps` steps of 8 rows, fp32, one torch thread per rank) runs through `run_stage_where_configured`,
the path the stage task takes, under `compute.launcher` auto (one process), torchrun (`nproc_per_node: 2`) and
ray (`nproc_per_node: 2` on a Ray instance this script starts on the host, both workers on it). Printed per
launcher, as medians over rounds: the median step time (rank 0's `step_seconds`, the first two steps left out),
the wall time of the stage, and the launch overhead: wall minus the sum of the step times (process or actor
start-up, imports, model load, process-group set-up, checkpoint writes, tear-down). The load average is printed
with the table. The Ray instance is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCHERS = {
    "local": [],
    "torchrun x2": ["compute.launcher=torchrun", "compute.nproc_per_node=2"],
    "ray x2": ["compute.launcher=ray", "compute.nproc_per_node=2"],
}


def sft_overrides(tmp: Path, steps: int) -> list[str]:
    return [
        f"storage.root=file://{tmp}/store",
        "tracking.enabled=false",
        f"stages.sft.steps={steps}",
        "stages.sft.batch_size=8",
        "stages.sft.micro_batch_size=4",
        "stages.sft.checkpoint_every=0",
        "stages.sft.warmup_steps=1",
    ]


def one_run(tmp: Path, data, steps: int, launcher: str, n: int) -> tuple[float, float]:
    """(median step seconds, wall seconds) of one SFT stage under `launcher`."""
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.context import ListSink, StageContext
    from cascade.stages.kinds import StageInputs
    from cascade.stages.launch import run_stage_where_configured

    recipe = load_recipe("micro", [*sft_overrides(tmp, steps), *LAUNCHERS[launcher]])
    work = tmp / f"work-{launcher.replace(' ', '')}-{n}"
    work.mkdir()
    sink = ListSink()
    ctx = StageContext(recipe, Store.from_config(recipe.storage), "bench", f"runs/bench/{n}-sft", sink, workdir=work)
    start = time.perf_counter()
    run_stage_where_configured(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
    wall = time.perf_counter() - start
    step_times = sink.series("step_seconds")
    return statistics.median(step_times[2:]), wall - sum(step_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.context import ListSink, StageContext
    from cascade.stages.kinds import StageInputs
    from cascade.stages.kinds.sft_data.run import run_sft_data

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        recipe = load_recipe("micro", sft_overrides(tmp, args.steps))
        ctx = StageContext(
            recipe, Store.from_config(recipe.storage), "bench", "runs/bench/00-sft_data", ListSink(), workdir=tmp
        )
        data = run_sft_data(recipe.stage("sft_data"), ctx, StageInputs()).checkpoint
        names = list(LAUNCHERS)
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                step, overhead = one_run(tmp, data, args.steps, name, len(sum(rows.values(), [])))
                rows[name].append((step, overhead))
                print(f"round {r + 1} {name}: {step * 1000:.1f} ms/step, overhead {overhead:.1f} s", file=sys.stderr)
    ray.shutdown()
    print(
        f"micro SFT, {args.steps} steps of 8 rows, fp32, 1 thread per rank; median of {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print("| launcher | step (ms) | launch overhead (s) |\n| --- | ---: | ---: |")
    for name, runs in rows.items():
        print(
            f"| {name} | {statistics.median(s for s, _ in runs) * 1000:.1f} | "
            f"{statistics.median(o for _, o in runs):.1f} |"
        )


if __name__ == "__main__":
    main()
