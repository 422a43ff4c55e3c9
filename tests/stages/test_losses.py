"""Losses and advantages against hand-computed tensors."""

import math

import pytest
import torch

from stages.losses import grpo_advantages, grpo_loss, groups_with_signal, sft_loss, token_entropy, token_logprobs


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv = grpo_advantages(rewards, eps=0.0 + 1e-6)
    # group 0: mean 0.5, sample std sqrt(1/3) -> +-0.5*sqrt(3)
    expected0 = 0.5 * math.sqrt(3)
    assert adv[0].tolist() == pytest.approx([expected0, -expected0, -expected0, expected0], abs=1e-5)
    # group 1: all equal -> zero advantage
    assert adv[1].tolist() == pytest.approx([0.0] * 4, abs=1e-9)
    # group 2: mean 0.25, sample std 0.5 -> (0.75/0.5, -0.25/0.5, ...)
    assert adv[2].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert groups_with_signal(rewards).tolist() == [True, False, True]


def test_grpo_loss_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], requires_grad=True)
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    num_tokens = 5
    loss = grpo_loss(logp, logp.detach(), adv, mask, num_tokens)
    # on-policy: ratio == 1, so L = -(2*2 + (-1)*3) / 5 = -0.2
    assert loss.item() == pytest.approx(-0.2, abs=1e-7)
    loss.backward()
    expected = torch.tensor([[-0.4, -0.4, 0.0], [0.2, 0.2, 0.2]])
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_grpo_loss_off_policy_ratio():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    old = torch.tensor([[math.log(0.25)]])
    loss = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 1), 1)
    assert loss.item() == pytest.approx(-2.0, abs=1e-6)  # ratio 2


def test_sft_loss_uses_global_count():
    logp = torch.tensor([[-1.0, -3.0], [-2.0, -4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert sft_loss(logp, mask, 3).item() == pytest.approx((1 + 2 + 4) / 3)
    assert sft_loss(logp[:1], mask[:1], 3).item() + sft_loss(logp[1:], mask[1:], 3).item() == pytest.approx(7 / 3)


def test_token_logprobs_and_entropy():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]]))
    targets = torch.tensor([[1, 2]])
    assert token_logprobs(logits, targets).tolist()[0] == pytest.approx([math.log(0.25), math.log(0.8)], abs=1e-6)
    h = token_entropy(logits)[0].tolist()
    assert h[0] == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)), abs=1e-6)
    assert h[1] == pytest.approx(-(2 * 0.1 * math.log(0.1) + 0.8 * math.log(0.8)), abs=1e-6)
