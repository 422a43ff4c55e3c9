"""The difficulty stage kind: its config, checks, estimate and row (here) and, in `run_difficulty.py`, its run function:
k rollouts of a reference model per train prompt, keeping the prompts it does not always solve.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_difficulty.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from cascade.artifacts.report import ReportCard
from cascade.stages.kinds.registry import StageKind, register_kind
from cascade.stages.recipe.config_base import (
    SMOLLM2,
    Count,
    Fraction,
    Name,
    Read,
    StageConfig,
    Temperature,
    TopP,
    imported_on_call,
    reference_kind,
)
from cascade.stages.recipe.estimate import StageEstimate, mean_new_tokens


class DifficultyConfig(StageConfig):
    """k rollouts of a reference model per train prompt; prompts it solves too often are dropped."""

    kind: Literal["difficulty"] = "difficulty"
    name: Name = "difficulty"
    domains: list[str]
    # an earlier model stage | an HF model dir | "smollm2-135m" | http(s)://host:port of an OpenAI-compatible server
    reference: str = "sft"
    reference_tokenizer: str | None = None  # endpoint only: HF dir or "smollm2-135m" it serves; None: the tiny one
    prompts_per_domain: Count | None = None  # the first N of each domain's train split; None: all train_size of them
    k: Count = 8  # rollouts per prompt
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    drop_solved_at: Count | None = None  # drop prompts solved in >= this many of k rollouts; None: k (every time)
    unsolved: Literal["keep", "drop", "keep_fraction"] = "keep"  # prompts solved 0/k times
    unsolved_fraction: Fraction | None = None  # with unsolved=keep_fraction: the share of them kept (seeded draw)

    def sampling_temperature(self) -> float | None:
        return self.temperature

    @model_validator(mode="after")
    def _check_thresholds(self) -> DifficultyConfig:
        if self.drop_solved_at is not None and not 1 <= self.drop_solved_at <= self.k:
            raise ValueError(
                f"stage {self.name!r}: drop_solved_at must be between 1 and k={self.k}, got {self.drop_solved_at}"
            )
        if (self.unsolved == "keep_fraction") != (self.unsolved_fraction is not None):
            raise ValueError(
                f"stage {self.name!r}: unsolved_fraction is required with unsolved=keep_fraction, and only then"
            )
        return self

    @property
    def solved_threshold(self) -> int:
        return self.k if self.drop_solved_at is None else self.drop_solved_at

    def named_domains(self) -> list[str]:
        return list(self.domains)

    def reads(self) -> list[Read]:
        if reference_kind(self.reference) != "stage":
            return []
        return [
            Read(
                "reference",
                self.reference,
                "policy",
                hint=f"; a model is an HF model dir (a path), {SMOLLM2!r} or an http(s):// endpoint",
            )
        ]


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate, its report card.


def _estimate_difficulty(cfg: DifficultyConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    prompts = sum(cfg.prompts_per_domain or recipe.domains[d].train_size for d in cfg.domains)
    return StageEstimate(
        cfg.name,
        cfg.kind,
        tokens_sampled=prompts * cfg.k * int(mean_new_tokens(recipe, cfg.domains)),
        notes=[f"reference {cfg.reference}: {prompts:,} prompts x {cfg.k}"],
    )


# The report's card of the filter (run_difficulty.py writes these metrics and the plot).
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


register_kind(
    StageKind(
        "difficulty",
        DifficultyConfig,
        imported_on_call("cascade.stages.kinds.difficulty.run_difficulty", "run_difficulty"),
        makes="prompts",
        takes_policy=False,
        holds_compute=False,
        estimate=_estimate_difficulty,
        report_card=DIFFICULTY_CARD,
        progress_unit="prompts",
    )
)
