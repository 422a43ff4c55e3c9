"""The reward_model stage kind: its config and the preference pairs it reads (here) and, in `run_reward_model.py`, its
run function: a Bradley-Terry reward model.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_reward_model.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from cascade.artifacts.config import Strict
from cascade.stages.kinds.registry import StageKind, register_kind
from cascade.stages.recipe.config_base import (
    SMOLLM2,
    BatchSize,
    Count,
    Every,
    Fraction,
    LearningRate,
    MicroBatched,
    Name,
    NonNegative,
    Read,
    StageConfig,
    Steps,
    TrainingConfig,
    imported_on_call,
    reference_kind,
)
from cascade.stages.recipe.estimate import StageEstimate, mean_new_tokens, training_storage


class DomainPairs(Strict):
    """Preference pairs built by a domain (`pairs(split, n, seed)`): the oracle answer over a near-miss."""

    kind: Literal["domain"] = "domain"
    domain: str = "chat"
    train: Count = 2000
    heldout: Count = 400


class OnPolicyPairs(Strict):
    """Pairs of the init policy's own answers, labelled by a domain's grader as a human labeller compares two
    samples (InstructGPT's reward-model data): `samples` answers per prompt at T=1, the best-graded over the
    worst; a prompt whose answers all grade the same gives no pair. The grader labels pairs only: it is never
    the RL reward."""

    kind: Literal["on_policy"] = "on_policy"
    domain: str = "chat"
    train: Count = 2000  # prompts of the domain's train split; the pairs are fewer (ties give none)
    heldout: Count = 400  # prompts of its held-out split, for pairwise accuracy
    samples: Annotated[int, Field(strict=True, ge=2, le=16)] = 4


class PreferenceFile(Strict):
    """Real preference pairs, one per row: JSONL (.jsonl, .jsonl.gz) or Parquet, local or any fsspec URL."""

    kind: Literal["file"] = "file"
    path: str
    format: Literal["jsonl", "parquet"] | None = None  # None: from the suffix
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    heldout_share: Fraction = 0.1  # the last rows, held out for pairwise accuracy


PairSource = Annotated[DomainPairs | OnPolicyPairs | PreferenceFile, Field(discriminator="kind")]


class RewardModelConfig(TrainingConfig, MicroBatched):
    """A Bradley-Terry reward model: a one-label sequence classifier trained on preference pairs."""

    kind: Literal["reward_model"] = "reward_model"
    name: Name = "rm"
    init: str = "sft"  # an earlier policy stage, an HF model dir or "smollm2-135m": the backbone
    pairs: PairSource = DomainPairs()
    steps: Steps = 300
    batch_size: BatchSize = 32  # pairs per optimizer step
    micro_batch_size: BatchSize = 32
    lr: LearningRate = 3e-4
    warmup_steps: Every = 20
    min_lr_ratio: Fraction = 0.1
    margin: NonNegative = 0.0  # Bradley-Terry margin: chosen must beat rejected by this much
    # Model selection: every select_every steps, pairwise accuracy on select_pairs pairs held back from the train
    # pairs (never the held-out ones, which report the result); the checkpoint is the step that scored best, and
    # the stage stops after `patience` checks without a better one (0: it runs every step). 0: the last step.
    select_every: Every = 0
    select_pairs: Count = 400
    patience: Every = 0
    # none: the stage is minutes long on a CPU, so a cut-off run repeats it; set it for a long one
    checkpoint_every: Every = 0
    # A step checkpoint does not change what the stage computes (a resume continues exactly). The stage had none
    # before, and its hash left them out: it still does, so a reward model trained before keeps its hash and cache.
    not_hashed: ClassVar[frozenset[str]] = TrainingConfig.not_hashed | {"checkpoint_every", "keep_step_checkpoints"}
    trains_classifier: ClassVar[bool] = True

    @model_validator(mode="after")
    def _selection_fits(self) -> RewardModelConfig:
        if self.select_every and self.checkpoint_every:
            # the best weights so far live in memory only: a resumed stage would have lost them
            raise ValueError(
                "select_every keeps the best step's weights in memory, which a step checkpoint does "
                "not hold: set checkpoint_every to 0"
            )
        if self.patience and not self.select_every:
            raise ValueError("patience counts model-selection checks: set select_every too")
        return self

    def backbone(self, source: str) -> str:
        return self.init if reference_kind(self.init) == "model" else source

    def reads(self) -> list[Read]:
        if reference_kind(self.init) != "stage":
            return []
        return [Read("init", self.init, "policy", hint=f"; a model is an HF model dir (a path) or {SMOLLM2!r}")]


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate.


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
        elif cfg.pairs.domain not in domain_names() or not get_domain(cfg.pairs.domain).builds_pairs:
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


def _estimate_reward_model(cfg: RewardModelConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    trained = cfg.steps * cfg.batch_size * 2 * (prompt_tokens + int(mean_new_tokens(recipe, None)))  # both answers
    sampled = 0
    if cfg.pairs.kind == "on_policy":  # the init policy answers every request `samples` times
        src = cfg.pairs
        sampled = (src.train + src.heldout) * src.samples * recipe.domains[src.domain].max_new_tokens
    return StageEstimate(
        cfg.name, cfg.kind, tokens_sampled=sampled, tokens_trained=trained, storage_bytes=training_storage(cfg, params)
    )


register_kind(
    StageKind(
        "reward_model",
        RewardModelConfig,
        imported_on_call("cascade.stages.kinds.reward_model.run_reward_model", "run_reward_model"),
        makes="reward_model",
        takes_policy=False,
        holds_compute=True,
        check=_check_reward_model,
        estimate=_estimate_reward_model,
        distributable=True,
    )
)
