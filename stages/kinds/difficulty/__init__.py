"""The difficulty stage kind: its config (here) and, in `run.py`, its run function: k rollouts of a reference
model per train prompt, keeping the prompts it does not always solve.

The registry (stages/kinds/__init__.py) imports the config, and `run.py` only on the row's first call:
validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from cascade.stages.config_base import (
    SMOLLM2,
    Count,
    Fraction,
    Name,
    Read,
    StageConfig,
    Temperature,
    TopP,
    reference_kind,
)


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
