"""The registry of stage kinds: one row per kind, read by everything that treats kinds differently.

A row says what a kind is: its config class, its run function, whether it starts from the run's newest policy,
what it makes, and whether it holds the compute slot while it runs; and every fact about the kind that anything
else treats differently: its plan estimate, its report card, the domains its gains are measured on, whether it
may run as a torchrun job, and whether the gate may recover with it. What a stage reads besides the policy is
its config's `reads()` (earlier stage name -> the product that stage must have made). Every run function has
one signature, `run(cfg, ctx, inputs) -> StageResult`. Nothing outside a kind's row and its own modules names
the kind (tests/test_kind_names.py).

Each built-in kind is a package beside this module, `stages/kinds/<kind>/`: its config in its `__init__.py`, which
this registry imports, and its run function in its `run.py`, which the row names by string and imports on the
first call (`imported_on_call`), so validating a recipe never loads torch, and a run function may import the
registry and the recipe without an import cycle.

Who reads the registry:
- the recipe (`stages/recipe.py`): a stage's `kind` picks its config class; `reads()` names earlier stages
  that make the right product; a row's `check` adds what only that kind knows; `recovers` admits the gate's
  recovery stage;
- the dispatcher (`run_stage` below); the cascade's walk (`stages/walk.py`): `makes` and `takes_policy`;
- the compute slot, the stage cache key and the report card in report.json (`tasks/stage.py`);
- the run form's steps and LR overrides (`flows/recipes.py`): kinds whose config is a `TrainingConfig`;
- where a stage runs (`stages/launch.py`, `infra/k8s.py`): `distributable`;
- the dry run (`stages/plan.py`): `estimate`; the gains tables (`gain_targets` below).

Adding a kind is one row: `register_kind(StageKind(...))` (docs/ARCHITECTURE.md has the checklist).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.artifacts.report import Breakdown, ReportCard
from cascade.stages.config_base import (
    OnPolicyConfig,
    Product,
    StageConfig,
    SyntheticSource,
    TrainingConfig,
    imported_on_call,
)
from cascade.stages.estimate import (
    DATA_BYTES_PER_TOKEN,
    StageEstimate,
    mean_new_tokens,
    training_storage,
)
from cascade.stages.kinds.difficulty import DifficultyConfig
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.mopd import MOPDConfig
from cascade.stages.kinds.reward_model import PreferenceFile, RewardModelConfig
from cascade.stages.kinds.sft import SFTConfig
from cascade.stages.kinds.sft_data import SFTDataConfig
from cascade.stages.reward_sources import REWARD_SOURCES, reward_terms

# A stage's run function: run(cfg, ctx: stages.context.StageContext, inputs: StageInputs) -> StageResult.
# (Typed loosely: stages.context imports the recipe, which imports this registry.)
StageRun = Callable[[Any, Any, "StageInputs"], Any]

# check(cfg, earlier stage configs, recipe domains) raises ValueError for what only this kind knows is wrong
StageCheck = Callable[[Any, list[StageConfig], set[str]], None]

# estimate(cfg, recipe, params: parameters stored, prompt_tokens) -> the stage's tokens, storage and notes; the
# plan (stages/plan.py) turns its tokens into seconds
StageEstimateFn = Callable[[Any, Any, int, int], StageEstimate]


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
    estimate: StageEstimateFn | None = None  # None: the plan says it has no estimate
    report_card: ReportCard | None = None  # what the run report's Data section shows of its stages
    # its run function runs as a torchrun job when its `compute:` asks for more than one rank (stages/launch.py);
    # only a training config has `compute:`
    distributable: bool = False
    # the gate may recover with it: its config's `teachers` (domain -> stage) the flow fills from the eval history,
    # one per domain of its `domains` (None: every recipe domain)
    recovers: bool = False
    # the stage's config chooses its teachers from the evals (MOPD's `teachers: auto`): the flow fills them in
    # before the stage runs, and the recipe needs evals on
    chooses_teachers: Callable[[Any], bool] | None = None

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
        raise ValueError(
            f"stage {cfg.name!r} trains on domain(s) {unfiltered} that difficulty stage {cfg.prompts!r} does not filter"
        )


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

        if cfg.pairs.kind == "on_policy":  # the policy answers at the domain's max_new_tokens; its grader labels
            if cfg.pairs.domain not in domains:
                raise ValueError(
                    f"stage {cfg.name!r}: on_policy pairs' domain {cfg.pairs.domain!r} is not declared in `domains`"
                )
        elif cfg.pairs.domain not in domain_names() or not hasattr(get_domain(cfg.pairs.domain), "pairs"):
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


def _estimate_sft_data(cfg: SFTDataConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    names = cfg.domains or list(recipe.domains)
    rows, note = source_rows(cfg, recipe, names)
    generated = [d for d in names if cfg.domain_teacher(d).kind != "oracle"]
    return StageEstimate(
        cfg.name,
        cfg.kind,
        tokens_sampled=sum(rows[d] * recipe.domains[d].max_new_tokens for d in generated),
        storage_bytes=sum(rows.values()) * (prompt_tokens + int(mean_new_tokens(recipe, names))) * DATA_BYTES_PER_TOKEN,
        notes=[note],
    )


def source_rows(cfg: SFTDataConfig, recipe: Any, names: list[str]) -> tuple[dict[str, int], str]:
    """(domain -> rows the estimate counts, the plan's note on them): synthetic rows and counted file rows; a file
    read whole is named, its rows unknown until it is read."""
    from cascade.stages.datasets.sources import draw_count, source_label

    rows = dict.fromkeys(names, 0)
    synthetic = counted = 0
    whole: list[str] = []
    for d in names:
        for src in cfg.domain_sources(d):
            n = draw_count(src, recipe.domains[d].train_size)
            if n is None:
                whole.append(source_label(d, src).split(":", 1)[1])
                continue
            rows[d] += n
            if isinstance(src, SyntheticSource):
                synthetic += n
            else:
                counted += n
    parts = [f"{synthetic:,} synthetic rows"] if synthetic or not (counted or whole) else []
    parts += [f"{counted:,} counted file rows"] if counted else []
    parts += [f"every row of {', '.join(whole)}"] if whole else []
    return rows, "; ".join(parts)


def _estimate_sft(cfg: SFTConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    trained = cfg.steps * cfg.batch_size * (prompt_tokens + int(mean_new_tokens(recipe, None)))
    return StageEstimate(cfg.name, cfg.kind, tokens_trained=trained, storage_bytes=training_storage(cfg, params))


def _estimate_difficulty(cfg: DifficultyConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    prompts = sum(cfg.prompts_per_domain or recipe.domains[d].train_size for d in cfg.domains)
    return StageEstimate(
        cfg.name,
        cfg.kind,
        tokens_sampled=prompts * cfg.k * int(mean_new_tokens(recipe, cfg.domains)),
        notes=[f"reference {cfg.reference}: {prompts:,} prompts x {cfg.k}"],
    )


def _on_policy_estimate(
    cfg: OnPolicyConfig, recipe: Any, params: int, domains: list[str] | None, frozen_models: int
) -> StageEstimate:
    """Every sampled token is trained on (an upper bound: GRPO drops groups without signal) and forwarded once
    through each frozen model (teacher, KL reference, reward model)."""
    sampled = cfg.steps * cfg.prompts_per_step * cfg.group_size * int(mean_new_tokens(recipe, domains))
    return StageEstimate(
        cfg.name,
        cfg.kind,
        tokens_sampled=sampled,
        tokens_trained=sampled,
        teacher_tokens=frozen_models * sampled,
        storage_bytes=training_storage(cfg, params),
    )


def _estimate_grpo(cfg: GRPOConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    scorers = sum(REWARD_SOURCES[term.source.kind].frozen_forward for term in reward_terms(cfg.reward))
    return _on_policy_estimate(cfg, recipe, params, cfg.domains, (cfg.kl_coef > 0) + scorers)


def _estimate_mopd(cfg: MOPDConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    domains = cfg.domains or (None if cfg.teachers == "auto" else list(cfg.teachers))
    return _on_policy_estimate(cfg, recipe, params, domains, 1)  # the domain's teacher


def _estimate_reward_model(cfg: RewardModelConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    trained = cfg.steps * cfg.batch_size * 2 * (prompt_tokens + int(mean_new_tokens(recipe, None)))  # both answers
    sampled = 0
    if cfg.pairs.kind == "on_policy":  # the init policy answers every request `samples` times
        src = cfg.pairs
        sampled = (src.train + src.heldout) * src.samples * recipe.domains[src.domain].max_new_tokens
    return StageEstimate(
        cfg.name, cfg.kind, tokens_sampled=sampled, tokens_trained=trained, storage_bytes=training_storage(cfg, params)
    )


# The data cards of the report (stages/datasets/card.py and stages/kinds/difficulty/run.py write these metrics and
# the plot).
SFT_DATA_CARD = ReportCard(
    title="SFT data card",
    totals=(("rows kept", "rows"), ("tokens", "tokens"), ("input rows", "input_rows"), ("shards", "shards")),
    breakdowns=(
        Breakdown(label="domain", columns=(("rows", "rows/"), ("tokens", "tokens/"))),
        Breakdown(label="dropped because", columns=(("rows", "dropped/"),)),
    ),
)
DIFFICULTY_CARD = ReportCard(
    title="Difficulty filter",
    totals=(
        ("prompts", "prompts"),
        ("kept", "kept"),
        ("dropped as solved", "dropped_solved"),
        ("dropped as unsolved", "dropped_unsolved"),
        ("rollouts sampled", "rollouts"),
    ),
    plots=("pass_rates",),
)


for _row in (
    StageKind(
        "sft_data",
        SFTDataConfig,
        imported_on_call("cascade.stages.kinds.sft_data.run", "run_sft_data"),
        makes="dataset",
        takes_policy=False,
        holds_compute=False,
        check=_check_sft_data,
        estimate=_estimate_sft_data,
        report_card=SFT_DATA_CARD,
    ),
    StageKind(
        "sft",
        SFTConfig,
        imported_on_call("cascade.stages.kinds.sft.run", "run_sft"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        estimate=_estimate_sft,
        distributable=True,
    ),
    StageKind(
        "difficulty",
        DifficultyConfig,
        imported_on_call("cascade.stages.kinds.difficulty.run", "run_difficulty"),
        makes="prompts",
        takes_policy=False,
        holds_compute=False,
        estimate=_estimate_difficulty,
        report_card=DIFFICULTY_CARD,
    ),
    StageKind(
        "grpo",
        GRPOConfig,
        imported_on_call("cascade.stages.kinds.grpo.run", "run_grpo"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        check=_check_grpo,
        gains_on=lambda cfg: list(cfg.domains),
        estimate=_estimate_grpo,
        distributable=True,
    ),
    StageKind(
        "reward_model",
        RewardModelConfig,
        imported_on_call("cascade.stages.kinds.reward_model.run", "run_reward_model"),
        makes="reward_model",
        takes_policy=False,
        holds_compute=True,
        check=_check_reward_model,
        estimate=_estimate_reward_model,
        distributable=True,
    ),
    StageKind(
        "mopd",
        MOPDConfig,
        imported_on_call("cascade.stages.kinds.mopd.run", "run_mopd"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        check=_check_mopd,
        estimate=_estimate_mopd,
        distributable=True,
        recovers=True,
        chooses_teachers=lambda cfg: cfg.teachers == "auto",
    ),
):
    register_kind(_row)
