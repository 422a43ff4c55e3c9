"""The loss seam: a new on-policy loss is one registered row and one config value (`loss:`), and trains."""

import pytest
import torch

from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.recipe.schema import RecipeError
from cascade.stages.train.context import ListSink
from cascade.stages.train.loss_registry import LossRow, register_loss, unregister_loss
from cascade.stages.train.model import build_tiny_model
from cascade.stages.train.tokenizer import load_tokenizer
from tests.stages.test_training import SMALL, stage_ctx, vowel_recipe, weights


class PlainReinforce:
    """L = -sum_{i,t} mask * A_i * logp_it / num_tokens: without the ratio exp(logp - sg[logp]), whose value is 1,
    GRPO's on-policy loss has this very gradient. Logs the share of the step's tokens it saw."""

    needs_reference = False
    metric_names = ("seen",)

    def __call__(self, batch):
        loss = -(batch.advantages.unsqueeze(-1) * batch.logp * batch.mask).sum() / batch.num_tokens
        return loss, {"seen": float(batch.mask.sum()) / batch.num_tokens}


@pytest.fixture
def plain_reinforce():
    register_loss(LossRow("plain_reinforce", "advantages", lambda cfg, setting: PlainReinforce()))
    yield
    unregister_loss("plain_reinforce")


def trained(tmp_path, monkeypatch, **grpo):
    recipe = vowel_recipe(tmp_path, monkeypatch, steps=2, micro_batch_size=16, **grpo)
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "rl", sink)
    run_grpo(recipe.stage("rl"), ctx, StageInputs())
    return sink, weights(ctx)


@pytest.mark.usefixtures("plain_reinforce")
def test_a_loss_added_from_one_place_trains_as_its_formula_says(tmp_path, monkeypatch):
    """The same 2 steps (fp32, no correction: pi_inf is pi_train) with GRPO's loss and with the toy one: the same
    weights, since their gradients are one (their values are not: GRPO's ratio is 1 where the toy has logp); the
    toy's metric is summed over the step's micro-batches of 16 rows to the whole step's share."""
    (tmp_path / "grpo").mkdir(), (tmp_path / "toy").mkdir()
    grpo_sink, grpo_weights = trained(tmp_path / "grpo", monkeypatch)
    toy_sink, toy_weights = trained(tmp_path / "toy", monkeypatch, loss="plain_reinforce")
    assert toy_sink.series("seen") == pytest.approx([1.0, 1.0]) and "seen" not in grpo_sink.rows[0][1]
    assert toy_sink.series("loss") != pytest.approx(grpo_sink.series("loss"), abs=1e-3)
    start = build_tiny_model(SMALL, len(load_tokenizer()), seed=0).state_dict()
    assert any(not torch.equal(value, start[name]) for name, value in toy_weights.items())
    for name, value in grpo_weights.items():
        torch.testing.assert_close(toy_weights[name], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("loss", "message"),
    [
        ("nope", "unknown loss 'nope'; known: grpo, mopd"),
        ("mopd", "stage 'rl': loss 'mopd' reads teacher, which a grpo stage does not give (it gives advantages)"),
    ],
)
def test_a_loss_the_stage_cannot_feed_is_refused_in_one_line(tmp_path, monkeypatch, loss, message):
    with pytest.raises(RecipeError) as e:
        vowel_recipe(tmp_path, monkeypatch, loss=loss)
    assert message in str(e.value) and "\n" not in str(e.value)
