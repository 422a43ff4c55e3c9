"""One stage of a run, executed in one place: adopt its committed checkpoint, or run its kind with its step log.

`standing` is the one answer to whether a stage is done. A committed checkpoint is adopted only when every file
verifies against its manifest, it was made under the stage's config, and its manifest's parent is the checkpoint
its input has now (the walk gives each stage its inputs: stages/recipe/walk.py). Otherwise the stage is rebuilt, and
the reason travels with it (`rebuilt`): a resume that rebuilds a stage into another checkpoint rebuilds every stage
made from the old one, so the final model descends from what the run holds. Its step checkpoints are judged the same
way: one made from another parent is discarded before the stage runs, never resumed.

Its callers: the Prefect stage task (tasks/stage.py: the cache key, the compute slot, MLflow, the run report), the
stage driver (stages/run.py) and `cascade status` / `cascade resume` (flows/cli/inspection.py, through `standings`).
What each adds around a stage that runs comes in through `StageHooks`; an adopted stage gets none of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cascade.artifacts import layout
from cascade.artifacts.checkpoint import (
    CheckpointRef,
    adoptable,
    committed_steps,
    discard_step_checkpoints,
    read_manifest,
)
from cascade.artifacts.config import config_hash
from cascade.artifacts.steplog import StepLog
from cascade.artifacts.store import Store
from cascade.stages.evals.gate import with_teachers
from cascade.stages.kinds import StageInputs, chooses_teachers
from cascade.stages.recipe.config_base import StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.walk import GateStep, Made, StageStep, walk

if TYPE_CHECKING:
    from cascade.stages.train.context import MetricSink


@dataclass(frozen=True)
class StageOfRun:
    """One stage of one run: `index` its position, so its checkpoint is at `runs/<run_id>/<index>-<name>`."""

    recipe: Recipe
    store: Store
    run_id: str
    index: int
    stage: StageConfig

    @property
    def key(self) -> str:
        return layout.stage_key(self.run_id, self.index, self.stage.name)


@dataclass(frozen=True)
class Standing:
    """Where a stage stands before it runs. `done`: the committed checkpoint a run adopts (None: the stage runs);
    `rebuilt`: why a checkpoint there is not adopted; `resumes_from`: the step checkpoint the run continues from;
    `stale_steps`: step checkpoints made from another parent, discarded before it runs; `follows`: an earlier stage
    that runs first and made this one's committed checkpoint, which is kept only if that stage comes out as it was."""

    done: CheckpointRef | None = None
    rebuilt: str | None = None
    resumes_from: int | None = None
    stale_steps: tuple[int, ...] = ()
    follows: str | None = None


@dataclass(frozen=True)
class StageOutcome:
    """What executing a stage gave: its checkpoint, adopted or made now; for one made now, why a committed one was
    rebuilt, its wall seconds (a wait for the compute slot included), its metrics and the kind's products (name ->
    path of an image inside the checkpoint)."""

    checkpoint: CheckpointRef
    adopted: bool
    rebuilt: str | None = None
    seconds: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)


class StageHooks:
    """What a caller adds around a stage that runs: its metric sink, its progress callback, what it holds while it
    runs (the compute slot), a word when it starts and notices. Each is asked for only when the stage runs."""

    def sink(self) -> MetricSink:
        raise NotImplementedError

    def progress(self) -> Callable[[int, int], None]:
        return lambda done, total: None

    def hold(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def starts(self, found: Standing) -> None:
        """Called just before the stage runs, with why a committed checkpoint is rebuilt (`found.rebuilt`)."""

    def notice(self, text: str) -> None:
        """Something the caller's log should hold that does not fail the stage."""


def standing(of: StageOfRun, inputs: StageInputs, runs_first: Collection[str] = ()) -> Standing:
    """Where the stage stands, given its inputs as they are now; `runs_first`: names of earlier stages that run
    before it, whose checkpoints are not known yet (their descendants `follow` them)."""
    config = config_hash(of.stage)
    done, problems = adoptable(of.store, of.key, config)
    rebuilt = f"its checkpoint did not verify: {'; '.join(problems)}" if problems else None
    if done is not None:
        parent = recorded_parent(of.store, of.key)
        if parent is not None and parent["stage"] in runs_first:
            return Standing(follows=parent["stage"])
        rebuilt = parent_change(parent, inputs)
        if rebuilt is None:
            return Standing(done=done)
    kept, stale = [], []
    for step in committed_steps(of.store, of.key, config):
        parent = recorded_parent(of.store, layout.step_key(of.key, step))
        unknown = parent is not None and parent["stage"] in runs_first
        (kept if unknown or parent_change(parent, inputs) is None else stale).append(step)
    return Standing(rebuilt=rebuilt, resumes_from=kept[-1] if kept else None, stale_steps=tuple(stale))


def recorded_parent(store: Store, key: str) -> dict[str, Any] | None:
    """The parent a committed checkpoint's manifest names (a CheckpointRef's fields), None for none."""
    return (read_manifest(store, key) or {}).get("parent")


def parent_change(parent: dict[str, Any] | None, inputs: StageInputs) -> str | None:
    """Why a checkpoint made from `parent` does not descend from the stage's inputs as they are now; None when it
    does, or when it names none (made from the recipe's model, or from data alone)."""
    if parent is None:
        return None
    for ref in inputs.checkpoints():
        if ref.key == parent["key"]:
            if ref.digest == parent["digest"]:
                return None
            return f"its parent {parent['stage']} changed (checkpoint {parent['digest'][:12]}, now {ref.digest[:12]})"
    return f"its parent {parent['stage']} is not one of its inputs now"


def execute_stage(of: StageOfRun, inputs: StageInputs, hooks: StageHooks) -> StageOutcome:
    """Adopt the stage's checkpoint when it is done, else run its kind (in this process, or ranks per its compute:
    stages/scale/launch.py), its steps logged to the run's step log and the caller's sink."""
    found = standing(of, inputs)
    if found.done is not None:
        return StageOutcome(found.done, adopted=True)
    # here, not at the top: they import torch and transformers, which adopting or judging a stage never needs
    from cascade.stages.scale.launch import run_stage_where_configured
    from cascade.stages.train.context import StageContext, TeeSink, stage_workdir

    discard_step_checkpoints(of.store, of.key, list(found.stale_steps))  # the stage would resume from them
    hooks.starts(found)
    steps = StepLog(of.store, of.run_id, of.index, of.stage.name)  # the report's curves; exact under resume
    started = time.time()
    try:
        with hooks.hold(), stage_workdir() as workdir:
            log = TeeSink(hooks.sink(), steps)
            ctx = StageContext(of.recipe, of.store, of.run_id, of.key, log, progress=hooks.progress(), workdir=workdir)
            result = run_stage_where_configured(of.stage, ctx, inputs)
    except BaseException:
        try:
            steps.close()
        except Exception as e:  # the stage's own error is the one to raise
            hooks.notice(f"step log {steps.key} not written ({e})")
        raise
    steps.close()
    return StageOutcome(
        result.checkpoint,
        adopted=False,
        rebuilt=found.rebuilt,
        seconds=time.time() - started,
        metrics=result.metrics,
        plots=result.plots,
    )


def standings(recipe: Recipe, store: Store, run_id: str) -> list[tuple[StageStep, Standing]]:
    """Every stage step of the run with where it stands in the store now, judged in the walk's order as a resume
    judges them: a stage that is not done runs first, and what was made from it follows it. As the flow does, a
    stage that chooses its teachers is judged with those the run's evals give it, and a gate's recovery the run made
    (its report holds it) is the newest policy after its gate."""
    from cascade.artifacts.report import RunReport  # `cascade status` only: the stage driver never reads a report

    report = RunReport.load(store, run_id) or RunReport(run_id=run_id, recipe=recipe.name)
    made, runs_first = Made(), []

    def judged(index: int, cfg: StageConfig) -> Standing:
        # the walk's inputs, less the stages that run first: a parent among those is judged once they have run
        here = standing(StageOfRun(recipe, store, run_id, index, cfg), made.inputs(cfg, made_only=True), runs_first)
        if here.done is not None:
            made.add(cfg, here.done)
        else:
            runs_first.append(cfg.name)
        return here

    found, evaluated = [], None
    for step in walk(recipe):
        if isinstance(step, StageStep):
            cfg = step.stage
            if chooses_teachers(cfg):
                cfg = with_teachers(cfg, recipe, report.evals_through(evaluated) if evaluated else []) or cfg
            found.append((step, judged(step.index, cfg)))
        elif isinstance(step, GateStep):
            evaluated = step.after
            if step.recovery is not None and report.stage(step.recovery.stage.name) is not None:
                planned = step.recovery.stage
                recovery = with_teachers(planned, recipe, report.evals_through(step.after)) or planned
                judged(step.index, recovery)
                evaluated = recovery.name
    return found


def describe(found: Standing, cfg: StageConfig) -> str:
    """What a resume does with the stage, in a few words (`cascade status` and `cascade resume` print them)."""
    if found.done is not None:
        return "committed, skipped"
    if found.follows is not None:
        return f"committed; kept if {found.follows} comes out as it was, else rebuilt"
    where = "starts"
    if found.resumes_from is not None:
        where = f"continues from its step checkpoint {found.resumes_from} of {cfg.step_count() or '?'}"
    return f"rebuilt ({found.rebuilt}): {where}" if found.rebuilt else where
