"""The cascade's shape, decided once: which stage runs when and from what, where the evals and the gate go, and what
a recovery inserts.

`walk(recipe)` is pure (configs in, steps out, nothing loaded or written): the eval of the source model, then
each recipe stage in order; after each policy-making stage (when evals are on) its eval and the gate, carrying
the `Recovery` the gate may insert there (policy `recover`: the recipe's `gate.recovery` config named
`recover-<stage>`, run at that stage's index; the stage it recovers is a field of it, never read from its name).
Its readers: the Prefect flow (flows/cascade.py), the stage driver (stages/run.py: the stage steps only), the dry
run (stages/recipe/plan.py) and `cascade status` (stages/execution.py `standings`). None of them decides the
shape on its own.

`Made` is what a walk carries from step to step while it runs: the checkpoint of every stage so far and the
newest policy. A stage's inputs are the newest policy (if its kind starts from one), the checkpoints of the
stages its config reads and, for a stage that distills, its teachers by domain; a stage whose kind makes a policy
becomes the newest policy, a recovery included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.kinds import StageInputs, kind_of
from cascade.stages.recipe.config_base import SOURCE_EVAL, StageConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.sections import RECOVERY_PREFIX, GateConfig


@dataclass(frozen=True)
class SourceEval:
    """The recipe's model evaluated before any stage runs (`eval.source`)."""


@dataclass(frozen=True)
class StageStep:
    """A recipe stage, `index` its position (its checkpoint is `runs/<run>/<index>-<name>`)."""

    index: int
    stage: StageConfig


@dataclass(frozen=True)
class Recovery:
    """The stage a gate inserts when it fires under policy `recover`, and the stage whose regression it recovers."""

    stage: StageConfig
    recovers: str


@dataclass(frozen=True)
class GateStep:
    """The eval of the policy `after` made, then the gate on it; `recovery`: what the gate inserts when it fires
    under policy `recover` (None under `warn` and `fail`), run at `index`."""

    index: int
    after: str
    recovery: Recovery | None


Step = SourceEval | StageStep | GateStep


def recovery_after(gate: GateConfig, after: str) -> Recovery:
    """The gate's recovery of the stage `after`: its config, named for that stage (the name keys its checkpoint)."""
    return Recovery(gate.recovery.model_copy(update={"name": f"{RECOVERY_PREFIX}{after}"}), recovers=after)


def walk(recipe: Recipe) -> list[Step]:
    """The steps of a run of `recipe`, in order (a recovery is a possibility of its gate step, not a step)."""
    steps: list[Step] = [SourceEval()] if recipe.eval.enabled and recipe.eval.source else []
    for index, stage in enumerate(recipe.stages):
        steps.append(StageStep(index, stage))
        if kind_of(stage.kind).makes == "policy" and recipe.eval.enabled:
            recovers = recipe.gate.policy == "recover" and recipe.gate.max_recoveries > 0
            steps.append(GateStep(index, stage.name, recovery_after(recipe.gate, stage.name) if recovers else None))
    return steps


def stage_steps(recipe: Recipe) -> list[StageStep]:
    return [step for step in walk(recipe) if isinstance(step, StageStep)]


@dataclass
class Made:
    """What the walk has made so far: stage name -> checkpoint, and the newest policy (None: the recipe's model)."""

    stages: dict[str, CheckpointRef] = field(default_factory=dict)
    policy: CheckpointRef | None = None

    def inputs(self, stage: StageConfig, made_only: bool = False) -> StageInputs:
        """What the stage takes: the newest policy if its kind starts from one, the stages it reads and its
        teachers. made_only: less the stages not made yet (`cascade status` judges a stage whose parents run
        first), where the walk has made every one."""
        wanted = dict.fromkeys(read.stage for read in stage.reads())
        teachers = stage.teacher_stages()
        return StageInputs(
            policy=self.policy if kind_of(stage.kind).takes_policy else None,
            stages={name: self.stages[name] for name in wanted if not made_only or name in self.stages},
            teachers={
                domain: None if name == SOURCE_EVAL else self.stages[name]
                for domain, name in teachers.items()
                if not made_only or name == SOURCE_EVAL or name in self.stages
            },
        )

    def add(self, stage: StageConfig, checkpoint: CheckpointRef) -> None:
        self.stages[stage.name] = checkpoint
        if kind_of(stage.kind).makes == "policy":
            self.policy = checkpoint
