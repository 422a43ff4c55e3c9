"""Rollouts one step ahead: GRPO's `max_staleness: 1`, the batch of step t+1 sampled while step t trains.

The paper's RL stages are strictly on-policy (max_staleness 0, the default and today's loop bit for bit): step t's
batch is drawn from the weights its update starts from, theta_t. With max_staleness 1 the engine draws step t+1's
batch from theta_t in a background thread while step t's update runs, as the asynchronous peers (PipelineRL,
prime-rl, AReaL) bound their staleness, and the update of step t+1 weights each of its tokens by

    w_t = min(pi_theta_{t+1}(y_t) / pi_inf(y_t), C)      (importance_correction tis; mis masks instead)

where pi_inf is the engine's logprob of the token under theta_t: the behaviour policy. So step t's batch comes
from theta_{max(t-1, 0)}, a fixed schedule rather than a race, and with the seeds of (recipe seed, stage, step)
a run is still one function of its seed.

Deviations, and why:
- At most one step of staleness. An engine holds one weight version: a batch in flight must be finished before
  the next weight sync, so a second batch in flight would only wait for the same sync.
- Only the sampling runs off the stage's thread. The gather across ranks is a collective and must keep its
  order with the update's collectives, and the scoring reads what the whole batch holds, so both run at the
  weight sync (`settle`), before the engine takes the new weights.
- Refill rounds decide on scored groups, which a batch drawn ahead does not have yet: a stage refuses
  refill_rounds with max_staleness 1 (GRPOConfig).

A step checkpoint carries the batch in flight (`carried`): a resumed stage trains on the batch it would have
drawn, and never on one twice. The overlap pays where the sampler has cores of its own (a vLLM server, another
Ray node); in one process on a CPU the two threads share the cores.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from cascade.stages.domains import Item
from cascade.stages.engines import Completion, RolloutEngine
from cascade.stages.train.rollout import RankShares, StepRequest

CARRY_KEY = "rollout_ahead"  # the batch in flight, in a step checkpoint's trainer state


@dataclass
class Rollout:
    """One step's scored batch: groups[p][j] is sample j of prompts[p] (items[p]), rewards [P, G]; `version` is
    the number of updates behind the weights that drew it (the step count when they were synced)."""

    items: list[Item]
    prompts: list[list[int]]
    groups: list[list[Completion]]
    rewards: torch.Tensor  # [P, G]
    version: int
    refilled: int = 0  # prompts sampled beyond P by refill rounds
    reward_metrics: dict[str, float] = field(default_factory=dict)  # the reward source's, for this batch

    def state(self) -> dict[str, Any]:
        """Plain data for a checkpoint: no class of this code base is pickled."""
        return {
            "items": [dataclasses.asdict(it) for it in self.items],
            "prompts": self.prompts,
            "groups": [[dataclasses.asdict(c) for c in group] for group in self.groups],
            "rewards": self.rewards.tolist(),
            "version": self.version,
            "refilled": self.refilled,
            "reward_metrics": self.reward_metrics,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Rollout:
        return cls(
            items=[Item(**it) for it in state["items"]],
            prompts=state["prompts"],
            groups=[[Completion(**c) for c in group] for group in state["groups"]],
            rewards=torch.tensor(state["rewards"]),
            version=state["version"],
            refilled=state["refilled"],
            reward_metrics=state["reward_metrics"],
        )


def sample_share(engine: RolloutEngine, request: StepRequest) -> list[list[Completion]]:
    """This rank's share of the request's samples, without a collective: safe off the stage's thread. A
    one-process engine's share is the whole request."""
    sample = engine.generate_share if isinstance(engine, RankShares) else engine.generate
    return sample(request.prompts, request.group_size, request.sampling)


def gather_shares(engine: RolloutEngine, share: list[list[Completion]]) -> list[list[Completion]]:
    """Every rank's samples in prompt order (a collective under torchrun or Ray; in one process, the share)."""
    return engine.gather(share) if isinstance(engine, RankShares) else share


class RolloutPipeline:
    """The batches an on-policy stage trains on, drawn now (`draw_now`, on the stage's thread) or one step ahead.

    draw_now(step) -> Rollout: the step's batch from the engine's current weights, scored (refills included).
    request(step) -> StepRequest, score(request, groups) -> (rewards, reward source metrics): the pieces of a batch
    drawn ahead. `version` counts the weight syncs: the version of the weights the engine holds."""

    def __init__(
        self,
        engine: RolloutEngine,
        draw_now: Callable[[int], Rollout],
        request: Callable[[int], StepRequest],
        score: Callable[[StepRequest, list[list[Completion]]], tuple[torch.Tensor, dict[str, float]]],
        max_staleness: int,
        version: int,
        carried: dict[str, Any] | None = None,
    ):
        self.engine, self.draw_now, self.request, self.score = engine, draw_now, request, score
        self.version = version
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead") if max_staleness else None
        self._in_flight: tuple[int, StepRequest, Future] | None = None
        self._ready: tuple[int, Rollout] | None = None
        if carried is not None:
            rollout = Rollout.from_state(carried["rollout"])
            self._ready = (carried["step"], rollout)

    def take(self, step: int) -> Rollout:
        """The batch of `step`: the one drawn ahead for it (settled or restored), else drawn now."""
        if self._ready is not None and self._ready[0] == step:
            rollout, self._ready = self._ready[1], None
            return rollout
        self._ready = None
        return self.draw_now(step)

    def draw_ahead(self, step: int) -> None:
        """With max_staleness 1: start sampling `step`'s batch in the background from the weights the engine holds."""
        if self._pool is None:
            return
        request = self.request(step)
        self._in_flight = (step, request, self._pool.submit(sample_share, self.engine, request))

    def settle(self) -> None:
        """Wait for the batch in flight, gather it across ranks and score it; it is then ready for its step."""
        if self._in_flight is None:
            return
        step, request, future = self._in_flight
        self._in_flight = None
        groups = gather_shares(self.engine, future.result())
        rewards, metrics = self.score(request, groups)
        self._ready = (step, Rollout(request.items, request.prompts, groups, rewards, self.version, 0, metrics))

    def sync(self, policy: Callable[[], torch.nn.Module]) -> float:
        """The engine takes the weights of `policy()` once the batch in flight (drawn from the old ones) is
        settled; `policy` runs only then, since it may refresh the very copy the batch is drawn from
        (TrainRun.policy_for_sampling). Returns the seconds the stage's thread waited for that batch."""
        started = time.perf_counter()
        self.settle()
        waited = time.perf_counter() - started
        self.engine.sync_weights(policy())
        self.version += 1
        return waited

    def carried(self) -> dict[str, Any] | None:
        """The settled batch not yet trained on, for a step checkpoint (None: nothing ahead)."""
        if self._ready is None:
            return None
        step, rollout = self._ready
        return {"step": step, "rollout": rollout.state()}

    def close(self) -> None:
        """Lets a batch in flight finish (an engine must not close under it), its outcome discarded."""
        if self._in_flight is not None:
            self._in_flight[2].exception()
            self._in_flight = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
