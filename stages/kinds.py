"""The registry of stage kinds: one row per kind, read by everything that treats kinds differently.

A row says what a kind is: its config class, its run function, whether it starts from the run's newest policy,
what it makes, and whether it holds the compute slot while it runs. What a stage reads besides the policy is
its config's `reads()` (earlier stage name -> the product that stage must have made). Every run function has
one signature, `run(cfg, ctx, inputs) -> StageResult`.

Who reads the registry:
- the recipe (`stages/recipe.py`): a stage's `kind` picks its config class; `reads()` names earlier stages
  that make the right product; a row's `check` adds what only that kind knows;
- the dispatcher (`run_stage` below) and the input wiring (`stage_inputs` below: the flow and the stage driver);
- the compute slot and the stage cache key (`tasks/stages.py`);
- the run form's steps and LR overrides (`flows/recipes.py`): kinds whose config is a `TrainingConfig`.

Adding a kind is one row: `register_kind(StageKind(...))` (docs/ARCHITECTURE.md has the checklist).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.config import (
    DifficultyConfig,
    GRPOConfig,
    MOPDConfig,
    PreferenceFile,
    Product,
    RewardModelConfig,
    SFTConfig,
    SFTDataConfig,
    StageConfig,
    TrainingConfig,
)

# A stage's run function: run(cfg, ctx: stages.context.StageContext, inputs: StageInputs) -> StageResult.
# (Typed loosely: stages.context imports the recipe, which imports this registry.)
StageRun = Callable[[Any, Any, "StageInputs"], Any]

# check(cfg, earlier stage configs, recipe domains) raises ValueError for what only this kind knows is wrong
StageCheck = Callable[[Any, list[StageConfig], set[str]], None]


@dataclass(frozen=True)
class StageInputs:
    """What a stage starts from: the newest policy (None: the recipe's initial model), and the checkpoint of
    every earlier stage its config `reads()`, by stage name."""

    policy: CheckpointRef | None = None
    stages: dict[str, CheckpointRef] = field(default_factory=dict)


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


def stage_inputs(stage: StageConfig, policy: CheckpointRef | None,
                 made: dict[str, CheckpointRef]) -> StageInputs:
    """What the registry says the stage takes: the newest policy, and the checkpoints of the stages it reads."""
    return StageInputs(policy=policy if kind_of(stage.kind).takes_policy else None,
                       stages={read.stage: made[read.stage] for read in stage.reads()})


def gain_targets(stages: list[StageConfig]) -> dict[str, list[str]]:
    """Stage name -> the domains its gain is measured on, for every stage whose kind says (`gains_on`)."""
    return {cfg.name: kind_of(cfg.kind).gains_on(cfg) for cfg in stages if kind_of(cfg.kind).gains_on}


def run_stage(cfg: StageConfig, ctx: Any, inputs: StageInputs) -> Any:
    return kind_of(cfg.kind).run(cfg, ctx, inputs)


def _lazy(module: str, function: str) -> StageRun:
    """A run function imported on first call: the recipe validates without loading torch and the models."""

    def run(cfg: Any, ctx: Any, inputs: StageInputs) -> Any:
        return getattr(importlib.import_module(module), function)(cfg, ctx, inputs)

    run.__qualname__ = f"{module}.{function}"
    return run


def _check_sft_data(cfg: SFTDataConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    extra = sorted((set(cfg.sources) | set(cfg.teachers)) - set(cfg.domains or domains))
    if extra:
        raise ValueError(f"stage {cfg.name!r} gives sources or teachers for domain(s) {extra} it does not build")


def _check_domain_weights(cfg: Any, trained: list[str]) -> None:
    stray = sorted(set(cfg.domain_weights or {}) - set(trained))
    if stray:
        raise ValueError(f"stage {cfg.name!r} weighs domain(s) {stray} it does not train on")


def _check_grpo(cfg: GRPOConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    _check_domain_weights(cfg, cfg.domains)
    if isinstance(cfg.prompts, dict):
        extra = sorted(set(cfg.prompts) - set(cfg.domains))
        if extra:
            raise ValueError(f"stage {cfg.name!r} gives prompts for domain(s) {extra} it does not train on")
    if not isinstance(cfg.prompts, str):
        return
    source = next(s for s in earlier if s.name == cfg.prompts)
    unfiltered = sorted(set(cfg.domains) - set(source.domains))
    if unfiltered:
        raise ValueError(f"stage {cfg.name!r} trains on domain(s) {unfiltered} that difficulty stage "
                         f"{cfg.prompts!r} does not filter")


def _check_mopd(cfg: MOPDConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    if cfg.teachers == "auto":
        if not any(KINDS[s.kind].makes == "policy" for s in earlier):
            raise ValueError(f"stage {cfg.name!r}: teachers: auto needs an earlier model stage to choose from")
        unknown = sorted(set(cfg.domains or []) - domains)
        if unknown:
            raise ValueError(f"stage {cfg.name!r} names domain(s) {unknown} not declared in `domains`")
        return
    if not cfg.teachers:
        raise ValueError(f"stage {cfg.name!r}: a mopd stage needs `teachers` (domain: earlier model stage)")
    missing = sorted(set(cfg.teachers) - domains)
    if missing:
        raise ValueError(f"stage {cfg.name!r} names teacher domain(s) {missing} not declared in `domains`")
    _check_domain_weights(cfg, cfg.domains or list(cfg.teachers))
    untaught = sorted(set(cfg.domains or []) - set(cfg.teachers))
    if untaught:
        raise ValueError(f"stage {cfg.name!r} has no teacher for domain(s) {untaught}")


def _check_reward_model(cfg: RewardModelConfig, earlier: list[StageConfig], domains: set[str]) -> None:
    """The pairs' domain must build pairs; a local preference file must exist and its first row must have the
    pair's fields, before any work."""
    if not isinstance(cfg.pairs, PreferenceFile):
        from cascade.stages.domains import domain_names, get_domain

        if cfg.pairs.domain not in domain_names() or not hasattr(get_domain(cfg.pairs.domain), "pairs"):
            raise ValueError(f"stage {cfg.name!r}: domain {cfg.pairs.domain!r} builds no preference pairs")
        return
    from pathlib import Path

    from cascade.stages.datasets.preferences import check_first_row

    local = cfg.pairs.path.removeprefix("file://")
    if "://" in local:
        return
    if not Path(local).is_file():
        raise ValueError(f"stage {cfg.name!r}: preference file not found: {cfg.pairs.path}")
    check_first_row(cfg.pairs, local)


for _row in (
    StageKind("sft_data", SFTDataConfig, _lazy("cascade.stages.sft_data", "run_sft_data"), makes="dataset",
              takes_policy=False, holds_compute=False, check=_check_sft_data),
    StageKind("sft", SFTConfig, _lazy("cascade.stages.sft", "run_sft"), makes="policy", takes_policy=True,
              holds_compute=True),
    StageKind("difficulty", DifficultyConfig, _lazy("cascade.stages.difficulty", "run_difficulty"), makes="prompts",
              takes_policy=False, holds_compute=False),
    StageKind("grpo", GRPOConfig, _lazy("cascade.stages.grpo", "run_grpo"), makes="policy", takes_policy=True,
              holds_compute=True, check=_check_grpo, gains_on=lambda cfg: list(cfg.domains)),
    StageKind("reward_model", RewardModelConfig, _lazy("cascade.stages.reward_model", "run_reward_model"),
              makes="reward_model", takes_policy=False, holds_compute=True, check=_check_reward_model),
    StageKind("mopd", MOPDConfig, _lazy("cascade.stages.mopd", "run_mopd"), makes="policy", takes_policy=True,
              holds_compute=True, check=_check_mopd),
):
    register_kind(_row)
