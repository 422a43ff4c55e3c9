"""Rollout plumbing shared by the on-policy stages (GRPO, MOPD): prompts, seeds, scoring, batch tensors.

Prompt choice and sampling seeds are functions of (recipe seed, stage name, step), so a stage resumed from a
step checkpoint draws exactly the prompts and samples it would have drawn.
"""

from __future__ import annotations

import random
from collections import defaultdict

import torch

from stages.config import OnPolicyConfig
from stages.domains import Item, get_domain
from stages.engines import Completion, RolloutEngine, SamplingParams
from stages.model import prompt_ids
from stages.recipe import Recipe


def prompt_pool(recipe: Recipe, domains: list[str], per_domain: int | None = None) -> list[Item]:
    """Each domain's train split: all train_size items, or its first per_domain (generation is a fixed stream)."""
    pool: list[Item] = []
    for name in domains:
        size = recipe.domains[name].train_size
        pool += get_domain(name).generate("train", size if per_domain is None else min(per_domain, size), recipe.seed)
    return pool


def sample_prompts(pool: list[Item], n: int, seed: int, stage: str, step: int) -> list[Item]:
    return random.Random(f"prompts:{seed}:{stage}:{step}").sample(pool, n)


def step_seed(seed: int, stage: str, step: int) -> int:
    return random.Random(f"sample:{seed}:{stage}:{step}").getrandbits(31)


def max_new_tokens(recipe: Recipe, domains: list[str]) -> int:
    return max(recipe.domains[d].max_new_tokens for d in domains)


def sample_groups(engine: RolloutEngine, tokenizer, pool: list[Item], cfg: OnPolicyConfig, recipe: Recipe,
                  domains: list[str], step: int) -> tuple[list[Item], list[list[int]], list[list[Completion]]]:
    """The rollout phase of every on-policy stage: this step's P prompts, their chat-formatted token ids, and
    G samples of each from the current policy (groups[p][j] is sample j of prompt p)."""
    items = sample_prompts(pool, cfg.prompts_per_step, recipe.seed, cfg.name, step)
    prompts = [prompt_ids(tokenizer, it.prompt) for it in items]
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                              max_new_tokens=max_new_tokens(recipe, domains), seed=step_seed(recipe.seed, cfg.name, step))
    return items, prompts, engine.generate(prompts, cfg.group_size, sampling)


def score_groups(items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
    """Rewards [P, G] from each item's domain grader, one grade_batch call per domain (sandboxes run in parallel)."""
    return score_texts(items, [[c.text for c in group] for group in groups])


def score_texts(items: list[Item], texts: list[list[str]]) -> torch.Tensor:
    """score_groups on completion texts alone: rewards [P, G] for texts[p][j], a response to items[p]."""
    by_domain: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, (item, group) in enumerate(zip(items, texts)):
        by_domain[item.domain] += [(p, j) for j in range(len(group))]
    rewards = torch.zeros(len(items), max(len(g) for g in texts))
    for domain, cells in by_domain.items():
        scores = get_domain(domain).grade_batch([items[p] for p, _ in cells], [texts[p][j] for p, j in cells])
        for (p, j), score in zip(cells, scores):
            rewards[p, j] = score
    return rewards


def reward_metrics(items: list[Item], rewards: torch.Tensor) -> dict[str, float]:
    """Mean reward overall and per domain. rewards: [P, G], row p belongs to items[p]."""
    metrics = {"reward": float(rewards.mean())}
    for domain in sorted({it.domain for it in items}):
        rows = [p for p, it in enumerate(items) if it.domain == domain]
        metrics[f"reward/{domain}"] = float(rewards[rows].mean())
    return metrics


def rollout_batch(pairs: list[tuple[list[int], Completion]], pad: int) -> tuple[torch.Tensor, ...]:
    """ids [N, T]; completion mask and engine logprobs [N, T-1], aligned with the targets ids[:, 1:]."""
    width = max(len(p) + len(c.token_ids) for p, c in pairs)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(pairs), width - 1))
    inf_logp = torch.zeros((len(pairs), width - 1))
    for row, (prompt, comp) in enumerate(pairs):
        n_p, n_c = len(prompt), len(comp.token_ids)
        ids[row, : n_p + n_c] = torch.tensor(prompt + comp.token_ids)
        mask[row, n_p - 1 : n_p - 1 + n_c] = 1.0
        inf_logp[row, n_p - 1 : n_p - 1 + n_c] = torch.tensor(comp.logprobs)
    return ids, mask, inf_logp
