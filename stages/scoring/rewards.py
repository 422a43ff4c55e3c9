"""Where an RL stage's rewards come from: one `RewardSource` interface, built from the stage's `reward:` config by
its row in the reward-source registry (stages/scoring/reward_sources.py).

GRPO asks its reward source for a [P, G] tensor of rewards for P prompts x G sampled completions, and never
looks behind it. The built-in sources:
- `grader`: the domain grader, the same function the eval scores with;
- `reward_model`: an earlier reward_model stage's scalar score, length-normalized within each group
  (stages.train.losses.length_normalized_rewards). It also reports the hidden grader's score of the same rollouts
  (`rubric_score` beside `rm_score`, and their correlation over the step's rollouts, `rm_rubric_corr`), so
  reward hacking shows as the curves parting in the run report; the grader never reaches the loss;
- `judge`: a generative judge behind an OpenAI-compatible endpoint, rollout vs reference (stages/scoring/judge.py);
- `callable`: a user's Python function, TRL's convention f(prompts, completions, **fields) -> list[float].
A list of weighted sources is their weighted sum (`WeightedRewards`). Every source is built as
`Source(cfg, ctx, stages)`, `stages` holding the checkpoints of the stages its config reads.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

import torch

from cascade.artifacts.checkpoint import CheckpointRef, materialize
from cascade.stages.domains import Item
from cascade.stages.engines import Completion
from cascade.stages.products import load_reward_model, sequence_scores
from cascade.stages.scoring.reward_sources import (
    MAX_REWARD,
    REWARD_SOURCES,
    CallableReward,
    RewardModelReward,
    import_function,
)
from cascade.stages.train.losses import length_normalized_rewards
from cascade.stages.train.model import completion_ids, prompt_ids
from cascade.stages.train.rollout import score_groups


class RewardSource(Protocol):
    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        """Rewards [P, G]: groups[p][j] is sample j for items[p]."""
        ...

    def close(self) -> None: ...

    def metrics(self) -> dict[str, float]:
        """What the last rewards() call measured besides the rewards (logged with the step)."""
        ...


class GraderRewards:
    """Each item's domain grader, one grade_batch call per domain (sandboxed graders run in parallel)."""

    def __init__(self, cfg: Any, ctx: Any, stages: dict[str, CheckpointRef]):
        self.recipe = ctx.recipe

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        return score_groups(self.recipe, items, groups)

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


class RewardModelRewards:
    """A Bradley-Terry reward model's score of prompt + completion, minus the group's length trend."""

    def __init__(self, cfg: RewardModelReward, ctx: Any, stages: dict[str, CheckpointRef]):
        local = materialize(ctx.store, stages[cfg.stage], Path(tempfile.mkdtemp(dir=ctx.workdir)))
        self.cfg, self.recipe = cfg, ctx.recipe
        self.model, self.tokenizer = load_reward_model(local / "model")
        self.model.eval()
        self.last: dict[str, float] = {}

    @torch.no_grad()
    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        seqs = [
            prompt_ids(self.tokenizer, item.prompt) + completion_ids(self.tokenizer, c.text)
            for item, group in zip(items, groups)
            for c in group
        ]
        pad, size = self.tokenizer.pad_token_id, self.cfg.batch_size
        scores = torch.cat([sequence_scores(self.model, seqs[i : i + size], pad) for i in range(0, len(seqs), size)])
        raw = scores.view(len(groups), -1)  # [P, G]
        lengths = torch.tensor([[len(c.token_ids) for c in group] for group in groups])
        rubric = score_groups(self.recipe, items, groups)
        self.last = {
            "rm_score": float(raw.mean()),
            "rubric_score": float(rubric.mean()),
            "rm_rubric_corr": correlation(raw.flatten(), rubric.flatten()),
        }
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


class CallableRewards:
    """A user's function called as TRL calls a reward function: f(prompts, completions, **fields) -> list[float],
    one entry per rollout, prompts[k] the prompt of completions[k]; fields are the item's (`id`, `domain`,
    `reference`, and each key of its `meta`, e.g. `answer`, which for a file's row holds its other columns), each a
    list aligned with the completions (None where an item lacks the key)."""

    def __init__(self, cfg: CallableReward, ctx: Any, stages: dict[str, CheckpointRef]):
        self.function, self.path, self.timeout_s = import_function(cfg.function), cfg.function, cfg.timeout_s

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        rows = [(item, c.text) for item, group in zip(items, groups) for c in group]
        return torch.tensor(self.scores(rows)).view(len(groups), -1)

    def scores(self, rows: list[tuple[Item, str]]) -> list[float]:
        """One reward per (item, completion) row, from one call of the function over them all."""
        keys = sorted({k for item, _ in rows for k in item.meta})
        fields = {
            "id": [i.id for i, _ in rows],
            "domain": [i.domain for i, _ in rows],
            "reference": [i.reference for i, _ in rows],
            **{k: [i.meta.get(k) for i, _ in rows] for k in keys},
        }
        scores = self.call(prompts=[i.prompt for i, _ in rows], completions=[text for _, text in rows], **fields)
        return checked_rewards(self.path, scores, len(rows))

    def grades(self, rows: list[tuple[Item, str]]) -> list[float]:
        """The rewards of (item, answer) rows as eval scores, each held to [0, 1] as a grader's are: pass@k counts
        a 1 as fully right, and the gate's tolerance is a fraction of that scale."""
        grades = self.scores(rows)
        for k, grade in enumerate(grades):
            if not 0.0 <= grade <= 1.0:
                raise ValueError(
                    f"reward function {self.path!r} returned {grade!r} for eval answer {k} of {len(grades)} (an eval "
                    "scores in [0, 1])"
                )
        return grades

    def call(self, **kwargs: Any) -> Any:
        """The function's answer, from a worker thread waited on for at most timeout_s. A thread cannot be killed:
        one past its limit is left running as a daemon, and the stage fails, so the process exits without it."""
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["value"] = self.function(**kwargs)
            except BaseException as e:  # a SystemExit too, which would end the thread without a word
                outcome["error"] = e

        worker = threading.Thread(target=work, name=f"reward {self.path}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            raise TimeoutError(
                f"reward function {self.path!r} did not return within {self.timeout_s:g} s (reward.timeout_s)"
            )
        error = outcome.get("error")
        if isinstance(error, SystemExit):  # on the stage's thread it ended `cascade run` with exit 0 mid-stage
            raise RuntimeError(f"reward function {self.path!r} raised SystemExit({error.code!r}) while scoring")
        if error is not None:
            raise error
        return outcome["value"]

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


def checked_rewards(path: str, scores: Any, count: int) -> list[float]:
    """The function's answer as `count` floats; a ValueError of one line for a wrong count or a reward that is not a
    finite number of magnitude at most MAX_REWARD (NaN would make every group flat and train nothing; inf would
    reach the loss, whose finite guard blames the sampling, stages/train/training.py)."""
    if len(scores) != count:
        raise ValueError(
            f"reward function {path!r} returned {len(scores)} rewards for {count} completions (one number each)"
        )
    rewards = []
    for k, score in enumerate(scores):
        try:
            reward = float(score)
        except (TypeError, ValueError, OverflowError):  # None, a string, an int past float's range
            reward = None
        if reward is None or not abs(reward) <= MAX_REWARD:  # `not <=`: NaN compares false with everything
            raise ValueError(
                f"reward function {path!r} returned {score if reward is None else reward!r} for rollout {k} of "
                f"{count} (a reward is a finite number of magnitude at most {MAX_REWARD:g})"
            )
        rewards.append(reward)
    return rewards


class WeightedRewards:
    """A weighted sum of sources: each rollout's reward is sum_k weight_k x reward_k. Each term's mean reward is
    logged as `reward_term/<k>:<kind>`, beside the terms' own metrics."""

    def __init__(self, terms: list[tuple[str, float, RewardSource]]):
        self.terms = terms  # (label, weight, source)
        self.last: dict[str, float] = {}

    def rewards(self, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
        total, self.last = None, {}
        for label, weight, source in self.terms:
            rewards = source.rewards(items, groups).float()
            self.last |= {**source.metrics(), f"reward_term/{label}": float(rewards.mean())}
            total = weight * rewards if total is None else total + weight * rewards
        return total

    def close(self) -> None:
        for _, _, source in self.terms:
            source.close()

    def metrics(self) -> dict[str, float]:
        return self.last


def make_reward_source(reward: Any, ctx: Any, stages: dict[str, CheckpointRef]) -> RewardSource:
    """The source a stage's `reward:` names, built by its registry row (a list: their weighted sum); `stages`
    holds the checkpoints of the stages it reads."""
    if not isinstance(reward, list):
        return REWARD_SOURCES[reward.kind].build(reward, ctx, stages)
    return WeightedRewards(
        [
            (f"{k}:{term.source.kind}", term.weight, REWARD_SOURCES[term.source.kind].build(term.source, ctx, stages))
            for k, term in enumerate(reward)
        ]
    )
