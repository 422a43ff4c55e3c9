"""The registry of stage kinds: what a kind's row says, and the lookups everything that treats kinds differently reads.

A row (`StageKind`) says what a kind is: its config class, its run function, whether it starts from the run's newest
policy, what it makes, and whether it holds the compute slot while it runs; and every fact about the kind that
anything else treats differently: its plan estimate, its report card, the domains its gains are measured on,
whether it may run as a torchrun job, whether the gate may recover with it, whether it chooses its teachers. What a
stage reads besides the policy is its config's `reads()` (earlier stage name -> the product that stage must have
made). Every run function has one signature, `run(cfg, ctx, inputs) -> StageResult`.

Each kind's row lives in its own folder (`stages/kinds/<kind>/__init__.py`, which calls `register_kind`), and
`load_kinds` imports every such folder; nothing outside a kind's folder names the kind (tests/test_kind_names.py).

Who reads the registry:
- the recipe (`stages/recipe/schema.py`): a stage's `kind` picks its config class; `reads()` names earlier stages
  that make the right product; a row's `check` adds what only that kind knows; `recovers` admits the gate's
  recovery stage;
- the dispatcher (`run_stage` below); the cascade's walk (`stages/recipe/walk.py`): `makes` and `takes_policy`;
- the compute slot, the stage cache key and the report card in report.json (`tasks/stage.py`);
- the run form's steps and LR overrides (`flows/recipes.py`): kinds whose config is a `TrainingConfig`;
- where a stage runs (`stages/scale/launch.py`, `infra/k8s.py`): `distributable`;
- the dry run (`stages/recipe/plan.py`): `estimate`; the gains tables (`gain_targets` below).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.report import ReportCard
from cascade.stages.recipe.config_base import Product, StageConfig, TrainingConfig
from cascade.stages.recipe.estimate import StageEstimate

# A stage's run function: run(cfg, ctx: stages.train.context.StageContext, inputs: StageInputs) -> StageResult.
# (Typed loosely: stages.train.context imports the recipe, which imports this registry.)
StageRun = Callable[[Any, Any, "StageInputs"], Any]


# check(cfg, earlier stage configs, recipe domains) raises ValueError for what only this kind knows is wrong
StageCheck = Callable[[Any, list[StageConfig], set[str]], None]


# estimate(cfg, recipe, params: parameters stored, prompt_tokens) -> the stage's tokens, storage and notes; the
# plan (stages/recipe/plan.py) turns its tokens into seconds
StageEstimateFn = Callable[[Any, Any, int, int], StageEstimate]


@dataclass(frozen=True)
class StageInputs:
    """What a stage starts from: the newest policy (None: the recipe's initial model), the checkpoint of every
    earlier stage its config `reads()` by stage name, and for a stage that distills, each domain's teacher by
    domain (None: the model source), which may come from other runs (the recover flow's baseline teachers)."""

    policy: CheckpointRef | None = None
    stages: dict[str, CheckpointRef] = field(default_factory=dict)
    teachers: dict[str, CheckpointRef | None] = field(default_factory=dict)

    def checkpoints(self) -> list[CheckpointRef]:
        """Every checkpoint the stage starts from: those its own checkpoint descends from."""
        return [r for r in (self.policy, *self.stages.values(), *self.teachers.values()) if r is not None]


@dataclass(frozen=True)
class StageKind:
    kind: str  # the recipe's `kind:`
    config: type[StageConfig]
    run: StageRun
    makes: Product  # "policy": the next policy, evaluated and gated after the stage
    takes_policy: bool  # starts from the newest policy of the run
    holds_compute: bool  # holds a slot of the compute limit while it runs
    check: StageCheck | None = None
    gains_on: Callable[[Any], list[str]] | None = None  # the domains its paired gain is measured on (RL: its own)
    estimate: StageEstimateFn | None = None  # None: the plan says it has no estimate
    report_card: ReportCard | None = None  # what the run report's Data section shows of its stages
    # its run function runs as a torchrun job when its `compute:` asks for more than one rank (stages/scale/launch.py);
    # only a training config has `compute:`
    distributable: bool = False
    # the gate may recover with it: its config's `teachers` (domain -> stage) the flow fills from the eval history,
    # one per domain of its `domains` (None: every recipe domain)
    recovers: bool = False
    # the stage's config chooses its teachers from the evals (MOPD's `teachers: auto`): the flow fills them in
    # before the stage runs, and the recipe needs evals on
    chooses_teachers: Callable[[Any], bool] | None = None
    progress_unit: str = "steps"  # what its progress counts (`<done>/<total> <unit>` in the CLI's lines)

    def __post_init__(self) -> None:
        if self.distributable and not issubclass(self.config, TrainingConfig):
            raise ValueError(f"kind {self.kind!r}: a distributable kind needs a TrainingConfig (its `compute:`)")
        if self.recovers and not {"teachers", "domains"} <= set(self.config.model_fields):
            raise ValueError(f"kind {self.kind!r}: a recovery kind's config needs `teachers` and `domains`")

    @property
    def trains(self) -> bool:
        """A training stage: the run form may override its steps and learning rate."""
        return issubclass(self.config, TrainingConfig)


KINDS: dict[str, StageKind] = {}


def register_kind(row: StageKind) -> None:
    """Add (or replace) a stage kind: the built-in ones below, a user's own, or a test's."""
    KINDS[row.kind] = row


def unregister_kind(kind: str) -> None:
    KINDS.pop(kind, None)


def kind_of(kind: str) -> StageKind:
    if kind not in KINDS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(sorted(KINDS))}")
    return KINDS[kind]


def chooses_teachers(stage: StageConfig) -> bool:
    """The stage's teachers come from the evals before it runs (its row's `chooses_teachers`)."""
    choose = kind_of(stage.kind).chooses_teachers
    return choose is not None and choose(stage)


def gain_targets(stages: list[StageConfig]) -> dict[str, list[str]]:
    """Stage name -> the domains its gain is measured on, for every stage whose kind says (`gains_on`)."""
    return {cfg.name: kind_of(cfg.kind).gains_on(cfg) for cfg in stages if kind_of(cfg.kind).gains_on}


def recovery_kinds() -> list[str]:
    """The kinds the gate may recover with."""
    return sorted(k for k, row in KINDS.items() if row.recovers)


def run_stage(cfg: StageConfig, ctx: Any, inputs: StageInputs) -> Any:
    return kind_of(cfg.kind).run(cfg, ctx, inputs)


def load_kinds(package: str, path: Iterable[str]) -> None:
    """Import every sub-package of `package` (its folders on `path`): each registers its kind's row."""
    for found in pkgutil.iter_modules(path):
        if found.ispkg:
            importlib.import_module(f"{package}.{found.name}")


def check_domain_weights(cfg: Any, trained: list[str]) -> None:
    """A stage's `domain_weights` may weigh only the domains it trains on (the kinds that take weights share it)."""
    stray = sorted(set(cfg.domain_weights or {}) - set(trained))
    if stray:
        raise ValueError(f"stage {cfg.name!r} weighs domain(s) {stray} it does not train on")
