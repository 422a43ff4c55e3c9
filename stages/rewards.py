"""Where an RL stage's rewards come from: one `RewardSource` interface, chosen by the stage's `reward:` config.

GRPO asks its reward source for a [P, G] tensor of rewards for P prompts x G sampled completions, and never
looks behind it. The first source is the domain grader, the same function the eval scores with; a trained
reward model and a judge endpoint plug in behind the same interface.
"""

from __future__ import annotations

from typing import Protocol

import torch

from stages.config import RewardConfig
from stages.domains import Item
from stages.engines import Completion
from stages.rollout import score_groups


class RewardSource(Protocol):
    name: str  # recorded in stage metrics

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        """Rewards [P, G]: groups[p][j] is sample j for items[p]."""
        ...

    def close(self) -> None:
        ...


class GraderRewards:
    """Each item's domain grader, one grade_batch call per domain (sandboxed graders run in parallel)."""

    name = "grader"

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        return score_groups(items, groups)

    def close(self) -> None:
        pass


def make_reward_source(cfg: RewardConfig) -> RewardSource:
    if cfg.kind == "grader":
        return GraderRewards()
    raise ValueError(f"unknown reward kind {cfg.kind!r}")
