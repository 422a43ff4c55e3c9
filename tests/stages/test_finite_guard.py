"""No non-finite loss or gradient reaches the weights: such a step is skipped, logged and counted, and
MAX_NONFINITE_IN_ROW of them in a row fail the stage in one line, before any checkpoint of it."""

from __future__ import annotations

import math

import pytest
import torch

import cascade.stages.kinds.sft.run_sft as sft_run
from cascade.stages.errors import NonFiniteSteps
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.config_base import OptimizerConfig
from cascade.stages.train.context import ListSink
from cascade.stages.train.training import MAX_NONFINITE_IN_ROW, clip_and_step, make_optimizer
from tests.conftest import micro_recipe
from tests.stages.test_training import stage_ctx, weights


def linear_after_one_step() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = make_optimizer(model, 1e-2, OptimizerConfig())
    model(torch.randn(5, 4)).square().mean().backward()
    assert math.isfinite(clip_and_step(model, optimizer, 1e-2, 1.0, loss=1.0))
    return model, optimizer


def snapshot(model, optimizer):
    params = [p.detach().clone() for p in model.parameters()]
    moments = [{k: v.clone() for k, v in optimizer.state[p].items()} for p in model.parameters()]
    return params, moments


@pytest.mark.parametrize("fault", ["nan_gradient", "inf_gradient", "nan_loss"])
def test_a_nonfinite_step_moves_neither_the_weights_nor_the_optimizer_state(fault):
    model, optimizer = linear_after_one_step()
    before = snapshot(model, optimizer)
    loss = model(torch.randn(5, 4)).square().mean()
    loss.backward()
    if fault != "nan_loss":
        model.weight.grad[0, 0] = math.nan if fault == "nan_gradient" else math.inf
    norm = clip_and_step(model, optimizer, 1e-2, 1.0, loss=math.nan if fault == "nan_loss" else float(loss.detach()))
    assert math.isnan(norm)
    after = snapshot(model, optimizer)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0]))
    assert all(torch.equal(a[k], b[k]) for a, b in zip(before[1], after[1]) for k in a)
    assert all(p.grad is None for p in model.parameters())  # nothing carries over into the next step


def sft_with_nan_loss_on(tmp_path, monkeypatch, bad_steps: set[int]):
    """The micro recipe's SFT (6 steps) with the loss of the 1-based steps in bad_steps made NaN."""
    recipe = micro_recipe(tmp_path)
    data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "sft", sink)
    steps_done = []
    real_step, real_loss = sft_run.clip_and_step, sft_run.sft_loss

    def counting_step(*args, **kwargs):
        steps_done.append(1)
        return real_step(*args, **kwargs)

    def loss(*args, **kwargs):
        value = real_loss(*args, **kwargs)
        return value * math.nan if len(steps_done) + 1 in bad_steps else value

    monkeypatch.setattr(sft_run, "clip_and_step", counting_step)
    monkeypatch.setattr(sft_run, "sft_loss", loss)

    def run():
        return sft_run.run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))

    return run, sink, ctx


def test_a_nan_step_is_skipped_logged_and_training_goes_on(tmp_path, monkeypatch):
    run, sink, ctx = sft_with_nan_loss_on(tmp_path, monkeypatch, {2, 4, 5})
    run()
    assert sink.series("skipped") == [0.0, 1.0, 0.0, 1.0, 1.0, 0.0]
    assert [math.isnan(n) for n in sink.series("grad_norm")] == [False, True, False, True, True, False]
    assert all(torch.isfinite(w).all() for w in weights(ctx).values())


def test_nonfinite_steps_in_a_row_fail_the_stage_in_one_line_and_commit_nothing(tmp_path, monkeypatch):
    run, sink, ctx = sft_with_nan_loss_on(tmp_path, monkeypatch, {2, 3, 4})
    with pytest.raises(NonFiniteSteps) as failed:
        run()
    assert MAX_NONFINITE_IN_ROW == 3
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"{ctx.key}: steps 2-4 were skipped, 3 in a row: ")
    assert "the loss was not finite" in message
    assert [s for s, _ in sink.rows] == [1, 2, 3]  # step 4 failed before it was logged
    assert not ctx.store.exists(f"{ctx.key}/MANIFEST.json")
