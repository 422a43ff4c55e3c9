"""Dynamic-sampling refill: groups without signal are replaced by fresh prompts' groups, a bounded number of rounds,
with seeds of their own so a resumed step replays them."""

from types import SimpleNamespace

import torch

from cascade.stages.domains import Item
from cascade.stages.engines.interface import Completion
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import rollout_and_score
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.train.tokenizer import load_tokenizer


class CountingEngine:
    """Samples nothing real; records how many prompts each rollout round sampled, and with which seed."""

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, sampling):
        self.calls.append((len(prompts), sampling.seed))
        return [[Completion([1], [0.0], "", "stop") for _ in range(n)] for p in prompts]


class SignalOnEvenIds:
    """Rewards [P, G]: a group carries signal (0, 1, 0, 1) when its item id is even, none (all 0) when odd."""

    def rewards(self, items, groups):
        return torch.tensor(
            [[float(j % 2) if int(it.id) % 2 == 0 else 0.0 for j in range(len(g))] for it, g in zip(items, groups)]
        )

    def metrics(self):
        return {}


TOKENIZER = load_tokenizer()
POOL = [Item("math", str(i), f"q{i:03d}", "", {}) for i in range(40)]


def run_for(refill_rounds, step=0):
    recipe = validate_recipe(
        {
            "domains": {"math": {"train_size": 40, "heldout_size": 4, "max_new_tokens": 4}},
            "stages": [{"kind": "grpo", "name": "rl", "domains": ["math"]}],
        }
    )
    cfg = GRPOConfig(name="rl", domains=["math"], prompts_per_step=8, group_size=4, refill_rounds=refill_rounds)
    run = SimpleNamespace(ctx=SimpleNamespace(recipe=recipe), tokenizer=TOKENIZER, world=SimpleNamespace(size=1))
    engine = CountingEngine()
    batch = rollout_and_score(engine, run, POOL, cfg, SignalOnEvenIds(), step)
    return (batch.items, batch.prompts, batch.groups, batch.rewards, batch.refilled), engine


def test_refill_replaces_groups_without_signal_with_fresh_prompts():
    (items, prompts, groups, rewards, refilled), engine = run_for(refill_rounds=3)
    without, _ = run_for(refill_rounds=0)
    first = without[0]
    odd_first = sum(int(it.id) % 2 for it in first)
    assert odd_first > 0  # the first draw has groups without signal to replace
    assert len(items) == len(prompts) == len(groups) == rewards.shape[0] == 8
    kept_first = [it for it in first if int(it.id) % 2 == 0]
    assert items[: len(kept_first)] == kept_first  # groups with signal stay, in order
    assert len({it.id for it in items}) == 8  # fresh prompts: no prompt twice in a step
    assert refilled == sum(n for n, _ in engine.calls[1:]) and engine.calls[0][0] == 8
    assert [n for n, _ in engine.calls[1:]][0] == odd_first  # a round samples only the missing prompts
    assert len(engine.calls) <= 1 + 3
    signal = (rewards.max(1).values > rewards.min(1).values).sum().item()
    assert signal == sum(int(it.id) % 2 == 0 for it in items) > len(kept_first)
    assert len({seed for _, seed in engine.calls}) == len(engine.calls)  # every round has its own seed


def test_refill_is_replayed_exactly_and_bounded():
    first, _ = run_for(refill_rounds=1, step=5)
    again, _ = run_for(refill_rounds=1, step=5)
    assert [it.id for it in first[0]] == [it.id for it in again[0]] and first[4] == again[4]
    (_, _, _, _, refilled), engine = run_for(refill_rounds=1)
    assert len(engine.calls) <= 2


def test_without_refill_the_step_keeps_its_draw():
    (items, _, _, rewards, refilled), engine = run_for(refill_rounds=0)
    assert refilled == 0 and len(engine.calls) == 1 and len(items) == 8
