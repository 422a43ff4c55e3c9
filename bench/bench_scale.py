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

    PYTHONPATH=. .venv/bin/python bench/bench_scale.py --grpo-ahead --steps 12 --rounds 3

GRPO with rollouts a step ahead on the Ray layout: micro's math_rl stage from micro's initial model, 2 ranks on
two Ray training nodes of 1 CPU each and the managed vLLM server as an actor on a rollout node
(infra/ray_local.py, all on this host), `--steps` steps of 4 prompts x 4 samples rewarded by the share of vowels
in the answer (bench/rewards.py: a random model has signal at once), with `max_staleness` 0 and 1, per round a
recipe seed of its own and the order alternated. Printed per variant: the stage's wall time, the median step
time and the median seconds a step waited for its rollouts (steps after the first), and the reward gain (mean of
the last quarter of steps minus the first quarter) with its SE across rounds, then the paired difference of
wall times and gains. Needs .venv-vllm (`make vllm`).
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
    from cascade.stages.kinds import StageInputs
    from cascade.stages.scale.launch import run_stage_where_configured
    from cascade.stages.train.context import ListSink, StageContext

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


AHEAD_STAGE = [
    "stages.math_rl.prompts_per_step=4",
    "stages.math_rl.group_size=4",
    "stages.math_rl.checkpoint_every=0",
    "stages.math_rl.lr=1e-2",
    "stages.math_rl.reward={kind: callable, function: 'bench.rewards:vowel_share'}",
    "engine.kind=vllm",
    "engine.ray_resources={rollout: 1}",
    "compute.launcher=ray",
    "compute.nnodes=2",
]


def ahead_run(tmp: Path, steps: int, staleness: int, seed: int) -> dict[str, float]:
    """One math_rl stage on the Ray layout: wall seconds, median step and rollout-wait seconds, reward gain."""
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.kinds import StageInputs
    from cascade.stages.scale.launch import run_stage_where_configured
    from cascade.stages.train.context import ListSink, StageContext

    overrides = [f"storage.root=file://{tmp}/store", "tracking.enabled=false", f"seed={seed}", *AHEAD_STAGE]
    recipe = load_recipe(
        "micro", [*overrides, f"stages.math_rl.steps={steps}", f"stages.math_rl.max_staleness={staleness}"]
    )
    work = tmp / f"work-{seed}-{staleness}"
    work.mkdir()
    sink = ListSink()
    key = f"runs/bench/{seed}-{staleness}-math_rl"
    ctx = StageContext(recipe, Store.from_config(recipe.storage), "bench", key, sink, workdir=work)
    start = time.perf_counter()
    run_stage_where_configured(recipe.stage("math_rl"), ctx, StageInputs())
    rewards, quarter = sink.series("reward"), max(1, steps // 4)
    return {
        "wall": time.perf_counter() - start,
        "step": statistics.median(sink.series("step_seconds")[1:]),
        "rollout": statistics.median(sink.series("rollout_seconds")[1:]),
        "gain": statistics.mean(rewards[-quarter:]) - statistics.mean(rewards[:quarter]),
    }


def mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):+.3f} ± {se:.3f}"


def grpo_ahead(steps: int, rounds: int) -> None:
    from cascade.infra.ray_local import local_ray_cluster

    runs: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with local_ray_cluster(tmp / "ray-home", {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}) as address:
            os.environ["RAY_ADDRESS"] = address
            for r in range(rounds):
                for staleness in (0, 1) if r % 2 == 0 else (1, 0):
                    row = ahead_run(tmp, steps, staleness, seed=100 + r)
                    runs[staleness].append(row)
                    print(f"round {r + 1} max_staleness {staleness}: {row}", file=sys.stderr)
    print(
        f"micro math_rl on Ray (2 training nodes of 1 CPU, vLLM on a rollout node), {steps} steps of 4 x 4, "
        f"{rounds} rounds (seeds 100-{99 + rounds}); load average {os.getloadavg()[0]:.2f}"
    )
    print("| max_staleness | wall (s) | step (s) | rollout wait (s) | reward gain (SE across rounds) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for staleness, rows in runs.items():
        med = {k: statistics.median(row[k] for row in rows) for k in ("wall", "step", "rollout")}
        print(
            f"| {staleness} | {med['wall']:.1f} | {med['step']:.2f} | {med['rollout']:.2f} | "
            f"{mean_se([row['gain'] for row in rows])} |"
        )
    walls = [b["wall"] - a["wall"] for a, b in zip(runs[0], runs[1])]
    gains = [b["gain"] - a["gain"] for a, b in zip(runs[0], runs[1])]
    print(f"paired, 1 minus 0: wall {mean_se(walls)} s, reward gain {mean_se(gains)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grpo-ahead", action="store_true", help="GRPO with max_staleness 0 and 1 on Ray + vLLM")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_worker_niceness", "0")
    if args.grpo_ahead:
        grpo_ahead(args.steps, args.rounds)
        return
    import ray

    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.kinds import StageInputs
    from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
    from cascade.stages.train.context import ListSink, StageContext

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
