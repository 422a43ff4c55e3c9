"""Rollouts one step ahead (GRPO's max_staleness: 1): which weights draw which batch, the overlap with the update,
learning on a tiny task, and resume parity with the batch in flight carried by the step checkpoint."""

import threading

import pytest
import torch
from pydantic import ValidationError

from cascade.stages.domains import Item
from cascade.stages.engines.interface import Completion, SamplingParams
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.train.context import ListSink
from cascade.stages.train.rollout import StepRequest
from cascade.stages.train.rollout_ahead import Rollout, RolloutPipeline
from tests.stages.test_training import crash_at_step, stage_ctx, vowel_recipe, weights


class VersionedEngine:
    """Samples one token whose id is the version of the weights it holds; `started` is set once a draw is under
    way and the draw then waits for `release`, so a test can see what runs while it samples."""

    name = "fake"

    def __init__(self):
        self.version, self.started, self.release = 0, threading.Event(), threading.Event()
        self.release.set()

    def generate(self, prompts, n, sampling):
        self.started.set()
        held = self.version
        assert self.release.wait(10)
        return [[Completion([held], [0.0], str(held), "stop") for _ in range(n)] for _ in prompts]

    def sync_weights(self, model):
        self.version += 1


def request(step):
    item = Item("math", str(step), f"q{step}", "", {})
    return StepRequest([item], [[1, 2]], 2, SamplingParams(max_new_tokens=1, seed=step))


def pipeline(engine, staleness, carried=None):
    def draw_now(step):
        groups = engine.generate([[1, 2]], 2, None)
        return Rollout(request(step).items, [[1, 2]], groups, torch.zeros(1, 2), engine.version)

    return RolloutPipeline(
        engine, draw_now, request, lambda req, groups: (torch.ones(1, 2), {"rm": 1.0}), staleness, 0, carried
    )


def drawn_by(rollouts, steps):
    """Runs the stage's loop order (take, draw ahead, update, sync) and returns each step's drawing version."""
    versions = []
    for step in range(steps):
        batch = rollouts.take(step)
        if step + 1 < steps:
            rollouts.draw_ahead(step + 1)
        versions.append(batch.groups[0][0].token_ids[0])
        rollouts.sync(lambda: torch.nn.Linear(1, 1))
    rollouts.close()
    return versions


def test_staleness_0_draws_each_batch_from_the_weights_its_update_starts_from():
    assert drawn_by(pipeline(VersionedEngine(), 0), 5) == [0, 1, 2, 3, 4]


def test_staleness_1_draws_step_t_from_the_weights_before_the_last_update():
    rollouts = pipeline(VersionedEngine(), 1)
    assert drawn_by(rollouts, 5) == [0, 0, 1, 2, 3]


def test_the_next_batch_samples_while_the_update_runs_and_the_sync_waits_for_it():
    engine = VersionedEngine()
    rollouts = pipeline(engine, 1)
    rollouts.take(0)
    engine.started.clear()
    engine.release.clear()
    rollouts.draw_ahead(1)
    assert engine.started.wait(10)  # sampling under way while the stage's thread is free to train
    asked = []

    def policy():  # a sampling copy is refreshed when it is asked for: never under a batch in flight
        asked.append(engine.release.is_set())
        return torch.nn.Linear(1, 1)

    syncing = threading.Thread(target=rollouts.sync, args=(policy,))
    syncing.start()
    syncing.join(0.3)
    assert syncing.is_alive() and engine.version == 0 and asked == []  # no new weights under a batch in flight
    engine.release.set()
    syncing.join(10)
    assert engine.version == 1 and asked == [True]
    batch = rollouts.take(1)
    assert batch.version == 0 and batch.rewards.tolist() == [[1.0, 1.0]] and batch.reward_metrics == {"rm": 1.0}
    rollouts.close()


def test_a_carried_batch_is_taken_once_and_survives_a_checkpoint_as_plain_data():
    engine = VersionedEngine()
    rollouts = pipeline(engine, 1)
    rollouts.take(0)
    rollouts.draw_ahead(1)
    rollouts.sync(lambda: torch.nn.Linear(1, 1))
    carried = rollouts.carried()
    rollouts.close()
    assert carried["step"] == 1 and carried["rollout"]["groups"][0][0]["token_ids"] == [0]
    engine.version = 5  # the resumed stage's engine holds newer weights
    resumed = pipeline(engine, 1, carried)
    assert resumed.take(1).groups[0][0].token_ids == [0]  # the batch drawn before the checkpoint
    assert resumed.take(1).groups[0][0].token_ids == [5]  # never twice: the next take draws afresh
    resumed.close()


def test_max_staleness_is_0_or_1_and_refuses_refill_rounds():
    with pytest.raises(ValidationError, match="refill_rounds choose prompts"):
        GRPOConfig(name="rl", domains=["math"], max_staleness=1, refill_rounds=1)
    with pytest.raises(ValidationError):
        GRPOConfig(name="rl", domains=["math"], max_staleness=2)
    assert GRPOConfig(name="rl", domains=["math"]).max_staleness == 0


@pytest.mark.slow
def test_staleness_1_learns_on_a_tiny_task_and_logs_its_staleness(tmp_path, monkeypatch):
    recipe = vowel_recipe(tmp_path, monkeypatch, max_staleness=1)
    sink = ListSink()
    run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    rewards = sink.series("reward")
    assert sum(rewards[-6:]) / 6 > sum(rewards[:6]) / 6 + 0.1
    assert sink.series("staleness") == [0.0] + [1.0] * 23
    assert "is_corrected" in sink.rows[-1][1]  # auto picks tis for stale tokens
    assert max(sink.series("logprob_mismatch")[1:]) > 1e-3  # the stale batch's behaviour policy is the older one


@pytest.mark.slow
def test_staleness_1_resume_parity_with_the_batch_in_flight(tmp_path, monkeypatch):
    """6 steps straight == a crash in step 5's update, resume from the step-4 checkpoint (which carries step 4's
    batch, drawn by the weights of step 3), 2 more steps."""
    finals, losses = [], []
    for attempt, crash in (("straight", False), ("resumed", True)):
        recipe = vowel_recipe(tmp_path / attempt, monkeypatch, max_staleness=1, steps=6, checkpoint_every=2)
        sink = ListSink()
        ctx = stage_ctx(recipe, tmp_path, "rl", sink)
        if crash:
            crash_at_step(monkeypatch, "cascade.stages.kinds.grpo.run_grpo.clip_and_step", 5)
            with pytest.raises(RuntimeError, match="preempted"):
                run_grpo(recipe.stage("rl"), ctx, StageInputs())
            monkeypatch.undo()
            assert [s for s, _ in sink.rows] == [1, 2, 3, 4]
            recipe = vowel_recipe(tmp_path / attempt, monkeypatch, max_staleness=1, steps=6, checkpoint_every=2)
        run_grpo(recipe.stage("rl"), ctx, StageInputs())
        finals.append(weights(ctx))
        losses.append(sink.series("loss"))
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)
    for name in finals[0]:
        assert torch.allclose(finals[0][name], finals[1][name], atol=1e-6), name
