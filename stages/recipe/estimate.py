"""What a stage kind's plan estimate is made of (stages/recipe/plan.py has the assumptions): the figures of one stage,
and the helpers every kind's `estimate` (a row in its folder, stages/kinds/<kind>/) shares. Nothing here loads a
model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FP32_BYTES = 4
DATA_BYTES_PER_TOKEN = 4  # a stored dataset row, per token of prompt and answer


@dataclass
class StageEstimate:
    stage: str
    kind: str
    tokens_sampled: int = 0
    tokens_trained: int = 0
    teacher_tokens: int = 0  # forward-only tokens of frozen models (MOPD teachers, KL references, reward models)
    storage_bytes: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def mean_new_tokens(recipe: Any, domains: list[str] | None) -> float:
    """The mean `max_new_tokens` of the domains (None: every recipe domain): an answer's length, as an upper bound."""
    names = domains or list(recipe.domains)
    return sum(recipe.domains[d].max_new_tokens for d in names) / len(names)


def checkpoint_bytes(params: int, step_checkpoints: int = 0) -> int:
    """The final checkpoint, plus the step checkpoints kept while the stage runs (weights + two moments)."""
    return params * FP32_BYTES * (1 + 3 * step_checkpoints)


def training_storage(cfg: Any, params: int) -> int:
    """A training stage's checkpoint and the step checkpoints it keeps (TrainingConfig's fields)."""
    return checkpoint_bytes(params, cfg.keep_step_checkpoints if cfg.checkpoint_every else 0)


def on_policy_estimate(
    cfg: Any, recipe: Any, params: int, domains: list[str] | None, frozen_models: int
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
