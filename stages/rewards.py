"""Where an RL stage's rewards come from: one `RewardSource` interface, chosen by the stage's `reward:` config.

GRPO asks its reward source for a [P, G] tensor of rewards for P prompts x G sampled completions, and never
looks behind it. Three sources:
- `grader`: the domain grader, the same function the eval scores with;
- `reward_model`: an earlier reward_model stage's scalar score, length-normalized within each group
  (stages.losses.length_normalized_rewards). It also reports the hidden grader's score of the same rollouts
  (`rubric_score` beside `rm_score`, and their correlation over the step's rollouts, `rm_rubric_corr`), so
  reward hacking shows as the curves parting in the run report; the grader never reaches the loss;
- `judge`: a generative judge behind an OpenAI-compatible endpoint, rollout vs reference (stages/judge.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Protocol

import torch

from cascade.artifacts.checkpoint import CheckpointRef, materialize
from cascade.stages.config import RewardConfig, RewardModelReward
from cascade.stages.domains import Item
from cascade.stages.engines import Completion
from cascade.stages.losses import length_normalized_rewards
from cascade.stages.model import completion_ids, prompt_ids
from cascade.stages.reward_model import load_reward_model, sequence_scores
from cascade.stages.rollout import score_groups


class RewardSource(Protocol):
    name: str  # recorded in stage metrics

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        """Rewards [P, G]: groups[p][j] is sample j for items[p]."""
        ...

    def close(self) -> None:
        ...

    def metrics(self) -> dict[str, float]:
        """What the last rewards() call measured besides the rewards (logged with the step)."""
        ...


class GraderRewards:
    """Each item's domain grader, one grade_batch call per domain (sandboxed graders run in parallel)."""

    name = "grader"

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        return score_groups(items, groups)

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


class RewardModelRewards:
    """A Bradley-Terry reward model's score of prompt + completion, minus the group's length trend."""

    name = "reward_model"

    def __init__(self, cfg: RewardModelReward, store: Any, checkpoint: CheckpointRef, workdir: Path):
        local = materialize(store, checkpoint, Path(tempfile.mkdtemp(dir=workdir)))
        self.cfg = cfg
        self.model, self.tokenizer = load_reward_model(local / "model")
        self.model.eval()
        self.last: dict[str, float] = {}

    @torch.no_grad()
    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        seqs = [prompt_ids(self.tokenizer, item.prompt) + completion_ids(self.tokenizer, c.text)
                for item, group in zip(items, groups) for c in group]
        pad, size = self.tokenizer.pad_token_id, self.cfg.batch_size
        scores = torch.cat([sequence_scores(self.model, seqs[i : i + size], pad) for i in range(0, len(seqs), size)])
        raw = scores.view(len(groups), -1)  # [P, G]
        lengths = torch.tensor([[len(c.token_ids) for c in group] for group in groups])
        rubric = score_groups(items, groups)
        self.last = {"rm_score": float(raw.mean()), "rubric_score": float(rubric.mean()),
                     "rm_rubric_corr": correlation(raw.flatten(), rubric.flatten())}
        return length_normalized_rewards(raw, lengths, self.cfg.length_coef)

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return self.last


def correlation(x: torch.Tensor, y: torch.Tensor) -> float:
    """Pearson correlation of two [N] vectors; 0 when either is constant (no ranking to agree on)."""
    if float(x.std()) == 0.0 or float(y.std()) == 0.0:
        return 0.0
    return float(torch.corrcoef(torch.stack([x.float(), y.float()]))[0, 1])


def make_reward_source(cfg: RewardConfig, ctx: Any, stages: dict[str, CheckpointRef]) -> RewardSource:
    """The source a stage's `reward:` names; `stages` holds the checkpoints of the stages it reads."""
    if cfg.kind == "grader":
        return GraderRewards()
    if cfg.kind == "reward_model":
        return RewardModelRewards(cfg, ctx.store, stages[cfg.stage], ctx.workdir)
    if cfg.kind == "judge":
        from cascade.stages.judge import JudgeRewards

        return JudgeRewards(cfg)
    raise ValueError(f"unknown reward kind {cfg.kind!r}")
