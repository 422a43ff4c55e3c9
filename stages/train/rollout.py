"""Rollout plumbing shared by the on-policy stages (GRPO, MOPD): prompts, seeds, scoring, batch tensors.

Prompt choice and sampling seeds are functions of (recipe seed, stage name, step), so a stage resumed from a
step checkpoint draws exactly the prompts and samples it would have drawn.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Any

import torch

from cascade.stages.domains import Item
from cascade.stages.engines import Completion, RolloutEngine, SamplingParams, make_engine, vllm_client
from cascade.stages.engines.interface import Progress
from cascade.stages.recipe.config_base import OnPolicyConfig
from cascade.stages.recipe.schema import Recipe
from cascade.stages.recipe.sections import EngineConfig
from cascade.stages.scale.distributed import full_weights_everywhere
from cascade.stages.train.model import prompt_ids


def prompt_pool(recipe: Recipe, domains: list[str], per_domain: int | None = None) -> list[Item]:
    """Each domain's train split: all train_size items, or its first per_domain (generation is a fixed stream)."""
    pool: list[Item] = []
    for name in domains:
        size = recipe.domains[name].train_size
        pool += recipe.domain(name).generate(
            "train", size if per_domain is None else min(per_domain, size), recipe.seed
        )
    return pool


def sample_prompts(
    pool: list[Item], n: int, seed: int, stage: str, step: int, weights: dict[str, float] | None = None, floor: int = 0
) -> list[Item]:
    """n prompts of the pool without replacement: uniformly, or `weights[d]`'s share of them from domain d; with a
    floor, every domain of the pool (of positive weight) gets at least `floor` of them, its share by pool size
    when no weights are given."""
    if weights is None and floor == 0:
        return random.Random(f"prompts:{seed}:{stage}:{step}").sample(pool, n)
    by_domain: dict[str, list[Item]] = defaultdict(list)
    for item in pool:
        by_domain[item.domain].append(item)
    if weights is None:
        weights = {d: float(len(items)) for d, items in by_domain.items()}
    drawn: list[Item] = []
    for domain, count in weighted_counts(n, weights, floor).items():
        if count > len(by_domain[domain]):
            raise ValueError(
                f"stage {stage!r}: domain {domain!r} has {len(by_domain[domain])} prompts, "
                f"fewer than its {count} of each step"
            )
        drawn += random.Random(f"prompts:{seed}:{stage}:{step}:{domain}").sample(by_domain[domain], count)
    return drawn


def weighted_counts(n: int, weights: dict[str, float], floor: int = 0) -> dict[str, int]:
    """n split by weight, by largest remainder (ties: domain name), so the counts sum to n exactly. A domain of
    positive weight whose share falls below `floor` gets `floor`, and the rest is split again among the others:
    a small domain of a blend still has a few groups of signal every step."""
    fixed: dict[str, int] = {d: 0 for d, w in weights.items() if w <= 0}
    if floor * (len(weights) - len(fixed)) > n:
        raise ValueError(f"{n} prompts per step cannot give {len(weights) - len(fixed)} domains {floor} each")
    while True:
        free = {d: w for d, w in sorted(weights.items()) if d not in fixed}
        left, total = n - sum(fixed.values()), sum(free.values())
        exact = {d: left * w / total for d, w in free.items()}
        short = [d for d, x in exact.items() if x < floor]
        if not short:
            break
        fixed.update({d: floor for d in short})
    counts = {**fixed, **{d: int(x) for d, x in exact.items()}}
    for d in sorted(exact, key=lambda d: counts[d] - exact[d])[: n - sum(counts.values())]:
        counts[d] += 1
    return dict(sorted(counts.items()))


def step_seed(seed: int, stage: str, step: int) -> int:
    return random.Random(f"sample:{seed}:{stage}:{step}").getrandbits(31)


def max_new_tokens(recipe: Recipe, domains: list[str]) -> int:
    return max(recipe.domains[d].max_new_tokens for d in domains)


def make_rollout_engine(cfg: EngineConfig, run: Any, seed: int, separate: bool = False) -> RolloutEngine:
    """The engine an on-policy stage samples with: on the trainer's policy in one process (with LoRA or
    `separate`, a copy of it: run.policy_for_sampling), else `ShardedRollouts` or `SharedServerRollouts`, whose
    replicas and servers are copies already (run: a stages.train.training.TrainRun)."""
    if not run.world.distributed:
        return make_engine(cfg, run.policy_for_sampling(separate), run.tokenizer, seed=seed)
    if cfg.kind == "vllm":
        return SharedServerRollouts(cfg, run, seed)
    return ShardedRollouts(cfg, run, seed)


def sync_metrics(engine: RolloutEngine) -> dict[str, float]:
    """The last weight sync's seconds and probe difference, for engines that check their weights (vLLM)."""
    last = engine.last_sync
    return (
        {"weight_sync_seconds": last["total_s"], "weight_probe_max_abs_diff": last["probe_max_abs_diff"]}
        if last
        else {}
    )


def unsharded_replica(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """A plain module of the policy's architecture holding its gathered `weights` (cast to `dtype`, if given):
    what an engine samples from or saves, where the trainer's FSDP2 shards cannot serve."""
    from transformers import AutoModelForCausalLM

    replica = AutoModelForCausalLM.from_config(model.config).to(device=device, dtype=dtype)
    replica.load_state_dict(weights)
    return replica


class RankShares:
    """An engine of a multi-rank stage whose ranks each sample a share of the prompts (`generate_share`, no
    collective): `generate` is every rank's share, gathered in prompt order on every rank."""

    world: Any

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seeds: list[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        groups = self.gather(self.generate_share(prompts, n, sampling, seeds))
        if progress is not None:  # the shares finish together, at the gather
            progress(len(groups), len(groups))
        return groups

    def generate_share(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, seeds: list[int] | None = None
    ) -> list[list[Completion]]:
        raise NotImplementedError

    def gather(self, share: list[list[Completion]]) -> list[list[Completion]]:
        """Every rank's share, in prompt order (a collective)."""
        return [group for rank_share in self.world.all_gather(share) for group in rank_share]


class ShardedRollouts(RankShares):
    """Under torchrun: each rank samples its share of the prompts (its seed offset by its rank; per-prompt `seeds`
    go with their prompts) from its own full copy of the policy, and every rank returns every rank's samples, in
    prompt order. The trainer's FSDP2 shards cannot generate: their forwards are collectives, and ranks stop
    decoding at different lengths."""

    def __init__(self, cfg: EngineConfig, run: Any, seed: int):
        self.world = run.world
        weights = full_weights_everywhere(run.model, self.world)
        self.replica = unsharded_replica(run.model, weights, self.world.device, run.sampling_dtype())
        self.engine = make_engine(cfg, self.replica, run.tokenizer, seed=seed + self.world.rank)
        self.name = self.engine.name

    def generate_share(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, seeds: list[int] | None = None
    ) -> list[list[Completion]]:
        if len(prompts) < self.world.size:
            raise ValueError(f"{len(prompts)} prompts per step cannot be shared by {self.world.size} ranks")
        mine = self.world.shard(len(prompts))
        seed = None if sampling.seed is None else sampling.seed + self.world.rank
        return self.engine.generate(
            prompts[mine.start : mine.stop],
            n,
            dataclasses.replace(sampling, seed=seed),
            seeds=None if seeds is None else seeds[mine.start : mine.stop],
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.replica.load_state_dict(full_weights_everywhere(model, self.world))
        self.engine.sync_weights(self.replica)

    @property
    def last_sync(self) -> dict[str, float]:
        return self.engine.last_sync

    def close(self) -> None:
        self.engine.close()


class SharedServerRollouts(RankShares):
    """Under torchrun or Ray with engine.kind vllm: one vLLM server serves every rank. Rank 0 starts the managed
    server (under Ray: as an actor on `engine.ray_resources`, stages/engines/vllm/ray_actor.py; under torchrun: on
    its own node, from an unsharded copy of the policy) or syncs the external one at engine.url; after each update
    it has the gathered weights loaded into the server and checked with the engine's logprob probe, while the
    other ranks wait for the result. Each rank then sends its share of the prompts, each prompt with its own seed
    (a slice of the whole step's `prompt_seeds`), so N ranks draw the samples that one process draws."""

    def __init__(self, cfg: EngineConfig, run: Any, seed: int):
        self.world, self.name = run.world, "vllm"
        weights = full_weights_everywhere(run.model, self.world)  # a collective: every rank gathers
        self.replica, self.server_actor, url = None, None, None
        if self.world.is_main and cfg.url is None and self.world.compute.runs_as == "ray":
            from cascade.stages.engines.vllm.ray_actor import start_rollout_server

            self.server_actor, place = start_rollout_server(cfg, run.model, run.tokenizer, weights)
            url = place["url"]
        elif self.world.is_main:  # on the CPU: it only saves the weights for the server and runs the probe's forward
            self.replica = unsharded_replica(run.model, weights, torch.device("cpu"))
            self.engine = make_engine(cfg, self.replica, run.tokenizer, seed=seed)
            url = self.engine.url
        url = self.world.from_main(url)
        if self.replica is None:
            self.engine = vllm_client(url, run.model, run.tokenizer)
        self.last_sync: dict[str, float] = {}

    def generate_share(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, seeds: list[int] | None = None
    ) -> list[list[Completion]]:
        from cascade.stages.engines.vllm.seeds import prompt_seeds

        if seeds is None and sampling.seed is not None:
            seeds = prompt_seeds(sampling.seed, len(prompts))
        mine = self.world.shard(len(prompts))
        return self.engine.generate(
            prompts[mine.start : mine.stop], n, sampling, seeds=None if seeds is None else seeds[mine.start : mine.stop]
        )

    def sync_weights(self, model: torch.nn.Module) -> None:
        weights = full_weights_everywhere(model, self.world)
        last = None
        if self.server_actor is not None:
            import ray

            last = ray.get(self.server_actor.sync.remote(weights))
        elif self.world.is_main:
            self.replica.load_state_dict(weights)
            self.engine.sync_weights(self.replica)
            last = self.engine.last_sync
        # the broadcast is also the barrier: no rank samples before the server holds the new weights
        self.last_sync = self.world.from_main(last)

    def close(self) -> None:
        self.engine.close()
        if self.server_actor is not None:
            import ray

            ray.get(self.server_actor.close.remote())
            ray.kill(self.server_actor)


def prompt_stream(cfg: OnPolicyConfig, refill: int = 0) -> str:
    """The name a step's prompt draw and sampling seed are keyed by: the stage's, or its refill round's."""
    return cfg.name if refill == 0 else f"{cfg.name}#refill{refill}"


def step_prompts(
    pool: list[Item], cfg: OnPolicyConfig, seed: int, step: int, refill: int = 0, count: int | None = None
) -> list[Item]:
    """The prompts an on-policy stage trains on at `step` (refill round `refill`: `count` of them): a function of
    (recipe seed, stage, step), so a resumed step, and bench/bench_learning.py's TRL peer, get the same ones."""
    floor = cfg.min_prompts_per_domain if refill == 0 else 0  # a refill fills what is missing
    return sample_prompts(
        pool, count or cfg.prompts_per_step, seed, prompt_stream(cfg, refill), step, cfg.domain_weights, floor
    )


@dataclasses.dataclass(frozen=True)
class StepRequest:
    """What a step's rollout phase samples: its prompts (items and chat-formatted ids), G of each, how."""

    items: list[Item]
    prompts: list[list[int]]
    group_size: int
    sampling: SamplingParams


def step_request(
    tokenizer,
    pool: list[Item],
    cfg: OnPolicyConfig,
    recipe: Recipe,
    domains: list[str],
    step: int,
    refill: int = 0,
    count: int | None = None,
) -> StepRequest:
    """This step's P prompts (or `count`), their chat-formatted token ids, and the step's sampling parameters.
    Refill round r > 0 of a step draws its prompts and samples with seeds of their own, so a resumed step replays
    every round."""
    items = step_prompts(pool, cfg, recipe.seed, step, refill, count)
    sampling = SamplingParams(
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        max_new_tokens=max_new_tokens(recipe, domains),
        seed=step_seed(recipe.seed, prompt_stream(cfg, refill), step),
    )
    return StepRequest(items, [prompt_ids(tokenizer, it.prompt) for it in items], cfg.group_size, sampling)


def sample_groups(engine: RolloutEngine, request: StepRequest) -> list[list[Completion]]:
    """The rollout phase of every on-policy stage: G samples of each of the request's prompts from the engine's
    current weights (groups[p][j] is sample j of prompt p)."""
    return engine.generate(request.prompts, request.group_size, request.sampling)


def score_groups(recipe: Recipe, items: list[Item], groups: list[list[Completion]]) -> torch.Tensor:
    """Rewards [P, G] from each item's domain grader, one grade_batch call per domain (sandboxes run in parallel).
    The grader is the recipe's domain, built with its `options`: the one the eval grades with."""
    return score_texts(recipe, items, [[c.text for c in group] for group in groups])


def score_texts(recipe: Recipe, items: list[Item], texts: list[list[str]]) -> torch.Tensor:
    """score_groups on completion texts alone: rewards [P, G] for texts[p][j], a response to items[p]."""
    by_domain: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for p, (item, group) in enumerate(zip(items, texts)):
        by_domain[item.domain] += [(p, j) for j in range(len(group))]
    rewards = torch.zeros(len(items), max(len(g) for g in texts))
    for domain, cells in by_domain.items():
        scores = recipe.domain(domain).grade_batch([items[p] for p, _ in cells], [texts[p][j] for p, j in cells])
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
