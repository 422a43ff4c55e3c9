"""The stage driver: a recipe's stages in order, or some of them, without Prefect or MLflow.

    python -m cascade.stages.run RECIPE [key=value ...] [--stage NAME ...] [--run-id ID] [--metrics-json FILE]
        [--profile FILE]

The same code path as the flow's stage task under a thinner caller: each stage goes through the stage-execution
core (stages/execution.py), in the order and with the inputs of the cascade's walk (stages/recipe/walk.py), and
writes the same checkpoint, step checkpoints and step log to the recipe's store. The core adopts a stage whose
committed checkpoint verifies, has the same config hash and was made from the checkpoint its input has now, as the
flow adopts it; otherwise the stage runs (in this process, or torchrun ranks per `compute:`). With `--stage`, only
the named stages run; every earlier stage must already be done in the run.

What it leaves out is the flow's: evals, the regression gate, recoveries, the run report, MLflow and the Prefect
UI (`cascade run` does all of that). It is for a machine with torch and transformers alone (a lent GPU) and for
profiling one stage; its imports stay within the stage core's (tests/stages/test_light_imports.py).
Bad input (an unknown recipe, a bad override, an unknown stage, an unwritable --metrics-json, a store that does
not answer, a run id another process holds) is one line and exit 2, before anything is written; a stage's own
failure (a rank that died, steps that were not finite) is one line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointError
from cascade.artifacts.config import SettingError
from cascade.artifacts.lease import LeaseHeld, hold_run
from cascade.artifacts.store import Store, StoreError
from cascade.stages.errors import DistributedStageError, ModelSourceError, NonFiniteSteps
from cascade.stages.execution import StageHooks, StageOfRun, StageOutcome, Standing, execute_stage, standings
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import Recipe, RecipeError, load_recipe
from cascade.stages.recipe.walk import Made, StageStep, stage_steps
from cascade.stages.scale.host import check_host

RUN_ID = "driver"


class DriverSink:
    """Each step's metrics (the stage adds its wall seconds, `step_seconds`): kept for the metrics JSON, and every
    `every`-th step shown as one line on stderr (the flow shows them in MLflow)."""

    def __init__(self, stage: str, every: int):
        self.stage, self.every = stage, every
        self.rows: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append({"step": step, **metrics})
        if step % self.every == 0:
            shown = " ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, (int, float)))
            print(f"[{self.stage}] step {step}: {shown}", file=sys.stderr, flush=True)

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        """No history to replace (stages.train.context.MetricSink.restore): its rows are what this process logged;
        the run's step log (StepLog) holds the stage's whole history."""


class DriverHooks(StageHooks):
    """What the driver adds around a stage that runs: its steps on stderr and in the metrics JSON, a line when it
    starts (saying why, when it rebuilds a committed checkpoint)."""

    def __init__(self, cfg: StageConfig, log_every: int):
        self.cfg, self.shown = cfg, DriverSink(cfg.name, log_every)

    def sink(self) -> DriverSink:
        return self.shown

    def starts(self, found: Standing) -> None:
        doing = f"rebuilding ({found.rebuilt})" if found.rebuilt else "running"
        print(f"[{self.cfg.name}] {self.cfg.kind}: {doing}", file=sys.stderr, flush=True)

    def notice(self, text: str) -> None:
        print(f"[{self.cfg.name}] {text}", file=sys.stderr, flush=True)


def run_stages(recipe: Recipe, run_id: str, only: list[str] | None = None, log_every: int = 10) -> dict[str, Any]:
    """The walk's stage steps in order (or through the last of those named in `only`, running only those);
    stage name -> {checkpoint, adopted | seconds, metrics, each step's metrics and, for a rebuilt stage, why}."""
    store = Store.from_config(recipe.storage)
    with hold_run(store, run_id):
        made, summary = Made(), {}
        for step in steps_to_take(recipe, store, run_id, only):
            hooks = DriverHooks(step.stage, log_every)
            of = StageOfRun(recipe, store, run_id, step.index, step.stage)
            outcome = execute_stage(of, made.inputs(step.stage), hooks)
            made.add(step.stage, outcome.checkpoint)
            summary[step.stage.name] = outcome_summary(outcome, hooks.shown)
    return summary


def steps_to_take(recipe: Recipe, store: Store, run_id: str, only: list[str] | None) -> list[StageStep]:
    """Each stage step through the last one to run. With `only`, a stage not named must be done as the store stands
    (stages/execution.py decides): refused before anything runs."""
    steps = stage_steps(recipe)
    last = max(i for i, step in enumerate(steps) if only is None or step.stage.name in only)
    if only is None:
        return steps[: last + 1]
    for step, found in standings(recipe, store, run_id)[: last + 1]:
        if found.done is None and step.stage.name not in only:
            why = found.rebuilt or (f"it follows {found.follows}, which runs first" if found.follows else None)
            raise RecipeError(
                f"stage {step.stage.name!r} of run {run_id!r} is not committed in {store.uri('')}"
                f"{f' as it stands ({why})' if why else ''}: run it first (name it with --stage, or drop --stage)"
            )
    return steps[: last + 1]


def outcome_summary(outcome: StageOutcome, shown: DriverSink) -> dict[str, Any]:
    """A stage's entry in the metrics JSON, and a line on stderr for a stage that ran."""
    if outcome.adopted:
        return {"checkpoint": outcome.checkpoint.uri, "adopted": True}
    seconds = round(outcome.seconds, 2)
    print(f"[{shown.stage}] committed {outcome.checkpoint.uri} in {seconds} s", file=sys.stderr, flush=True)
    ran = {"checkpoint": outcome.checkpoint.uri, "seconds": seconds, "metrics": outcome.metrics, "steps": shown.rows}
    return {**ran, "rebuilt": outcome.rebuilt} if outcome.rebuilt else ran


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cascade.stages.run", description=__doc__.split("\n")[0])
    parser.add_argument("recipe", help="a shipped recipe's name or a YAML file")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. compute.device=cuda stages.sft.steps=20")
    parser.add_argument(
        "--stage",
        action="append",
        dest="stages",
        metavar="NAME",
        help="run only this stage (repeatable); earlier stages must be committed",
    )
    parser.add_argument("--run-id", default=RUN_ID)
    parser.add_argument("--log-every", type=int, default=10, help="print every N-th step's metrics")
    parser.add_argument("--metrics-json", type=Path, help="write each stage's checkpoint, seconds and metrics here")
    parser.add_argument(
        "--profile", type=Path, help="run under torch.profiler; write its table of ops and grpo.* phases here"
    )
    return parser.parse_intermixed_args(argv)  # overrides may follow the options


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        unknown = sorted(set(args.stages or []) - {s.name for s in recipe.stages})
        if unknown:
            raise RecipeError(
                f"no stage named {unknown[0]!r} in recipe {recipe.name!r} "
                f"(stages: {', '.join(s.name for s in recipe.stages)})"
            )
        if not layout.valid_run_id(args.run_id):
            raise RecipeError(
                f"bad --run-id {args.run_id!r}: lowercase letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
        if args.log_every < 1:
            raise RecipeError(f"--log-every must be at least 1, not {args.log_every}")
        check_host(recipe)
        for option, path in (("--metrics-json", args.metrics_json), ("--profile", args.profile)):
            if path:
                refuse_unwritable(option, path)
        with profiled(args.profile):
            summary = run_stages(recipe, args.run_id, args.stages, args.log_every)
        if args.metrics_json:
            args.metrics_json.write_text(json.dumps(summary, indent=1))
    except BAD_INPUT as e:
        return one_line(e, 2)
    except (DistributedStageError, NonFiniteSteps, OSError) as e:  # a stage's own one-line failures; a full disk
        return one_line(e, 1)
    return 0


# Bad input or a setting the run cannot use, answered as one line and exit 2: the recipe, a store that does not
# answer, a run id another process holds, a model source that cannot be read.
BAD_INPUT = (RecipeError, StoreError, SettingError, LeaseHeld, ModelSourceError, CheckpointError)


def one_line(error: BaseException, code: int) -> int:
    text = str(error).strip()
    print(f"error: {text.splitlines()[0] if text else type(error).__name__}", file=sys.stderr)
    return code


def refuse_unwritable(option: str, path: Path) -> None:
    """--metrics-json and --profile are written after the last stage: a path that cannot take one is refused
    before the first."""
    if path.is_dir():
        raise RecipeError(f"{option} {path}: is a directory")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise RecipeError(f"{option} {path}: no folder {folder}")
    if not os.access(path if path.exists() else folder, os.W_OK):
        raise RecipeError(f"{option} {path}: not writable")


@contextmanager
def profiled(table: Path | None) -> Iterator[None]:
    """The stages under torch.profiler (the CPU, and CUDA where torch sees it), its ops and the stages' named
    ranges (grpo.rollout, grpo.forward_backward, ...) written to `table`, most device time first; None: as is."""
    if table is None:
        yield
        return
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
    from torch.autograd.profiler_util import EventList

    order = "cuda_time_total" if cuda else "cpu_time_total"
    ops = prof.key_averages()
    phases = EventList([e for e in ops if e.key.startswith(PROFILED_PHASES)])
    tables = [events.table(sort_by=order, row_limit=40, max_name_column_width=60) for events in (phases, ops)]
    table.write_text("\n".join(tables) + "\n")


PROFILED_PHASES = ("grpo.",)  # the stages' record_function ranges, listed whole before the 40 costliest ops


if __name__ == "__main__":
    sys.exit(main())
