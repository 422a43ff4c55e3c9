"""Losses and advantages against hand-computed tensors."""

import math

import pytest
import torch

from cascade.stages.train.losses import (
    bradley_terry_loss,
    groups_with_signal,
    grpo_advantages,
    grpo_loss,
    kl_k3,
    length_normalized_rewards,
    mis_weights,
    sft_loss,
    shuffled_rewards,
    tis_weights,
    token_entropy,
    token_logprobs,
)


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


def test_importance_weights_hand_computed():
    """rho = pi_train / pi_inf per token: 0.25, 0.8, 1, 3, 6. tis caps at 2; mis keeps [0.5, 5] and zeroes the rest."""
    rho = torch.tensor([[0.25, 0.8, 1.0, 3.0, 6.0]])
    inf_logp = torch.log(torch.tensor([[0.4, 0.5, 0.3, 0.1, 0.05]]))
    logp = (inf_logp + torch.log(rho)).requires_grad_()
    torch.testing.assert_close(tis_weights(logp, inf_logp, 2.0), torch.tensor([[0.25, 0.8, 1.0, 2.0, 2.0]]))
    torch.testing.assert_close(mis_weights(logp, inf_logp, 0.5, 5.0), torch.tensor([[0.0, 0.8, 1.0, 3.0, 0.0]]))
    assert not tis_weights(logp, inf_logp, 2.0).requires_grad  # a weight, not a path for the gradient


def test_grpo_loss_with_token_weights_value_and_gradient():
    """L = -sum mask * w * A / N on-policy; grad = -mask * w * A / N. w = 1 is the unweighted loss bit for bit."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], requires_grad=True)
    adv, mask = torch.tensor([2.0, -1.0]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    weight = torch.tensor([[0.5, 2.0, 7.0], [1.0, 0.0, 1.5]])
    loss = grpo_loss(logp, logp.detach(), adv, mask, 5, weight)
    # -(2 * (0.5 + 2.0) + (-1) * (1.0 + 0.0 + 1.5)) / 5 = -(5 - 2.5) / 5 = -0.5
    assert loss.item() == pytest.approx(-0.5, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.8, 0.0], [0.2, 0.0, 0.3]]))
    ones = grpo_loss(logp, logp.detach(), adv, mask, 5, torch.ones_like(mask))
    assert torch.equal(ones, grpo_loss(logp, logp.detach(), adv, mask, 5))


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


def test_token_logprobs_equal_log_softmax_in_value_and_gradient():
    """The gather-minus-logsumexp form is log_softmax's value and gradient, on large logits and bf16 input too."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 50, generator=gen) * 30).requires_grad_()
    targets = torch.randint(0, 50, (3, 5), generator=gen)
    weights = torch.randn(3, 5, generator=gen)
    ours = token_logprobs(logits, targets)
    (grad_ours,) = torch.autograd.grad((ours * weights).sum(), logits)
    ref = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(ours, ref, rtol=0, atol=2e-5)
    torch.testing.assert_close(grad_ours, grad_ref, rtol=0, atol=5e-6)  # float rounding of |logits| ~ 30
    half = logits.detach().bfloat16()
    assert token_logprobs(half, targets).dtype == torch.float32
    torch.testing.assert_close(
        token_logprobs(half, targets),
        torch.log_softmax(half.float(), -1).gather(-1, targets[..., None])[..., 0],
        rtol=0,
        atol=2e-5,
    )


def test_bradley_terry_loss_hand_computed_with_and_without_margin():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # gaps 1 and -1: (log(1 + e^-1) + log(1 + e)) / 2
    assert float(bradley_terry_loss(chosen, rejected, 2)) == pytest.approx(0.8132617, abs=1e-6)
    # margin 0.5: gaps 0.5 and -1.5: (log(1 + e^-0.5) + log(1 + e^1.5)) / 2
    assert float(bradley_terry_loss(chosen, rejected, 2, margin=0.5)) == pytest.approx(1.0877451, abs=1e-6)
    # a huge gap stays finite (logsigmoid, not log(sigmoid))
    assert float(bradley_terry_loss(torch.tensor([0.0]), torch.tensor([200.0]), 1)) == pytest.approx(200.0)


def test_bradley_terry_micro_batches_sum_to_the_full_batch_in_value_and_gradient():
    torch.manual_seed(0)
    chosen, rejected = torch.randn(6, requires_grad=True), torch.randn(6)
    full = bradley_terry_loss(chosen, rejected, 6, margin=0.2)
    (g_full,) = torch.autograd.grad(full, chosen)
    parts = sum(bradley_terry_loss(chosen[s], rejected[s], 6, margin=0.2) for s in (slice(0, 2), slice(2, 6)))
    (g_parts,) = torch.autograd.grad(parts, chosen)
    assert float(parts.detach()) == pytest.approx(float(full.detach()), abs=1e-6)
    assert torch.allclose(g_parts, g_full, atol=1e-7)


def test_kl_k3_hand_computed_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding: its huge k3 must not count
    kl = kl_k3(logp, ref, mask, 2)
    # delta = ref - logp = -0.5, 1: (e^-0.5 + 0.5 - 1) + (e - 1 - 1) = 0.1065307 + 0.7182818, over 2 tokens
    assert float(kl.detach()) == pytest.approx(0.4124063, abs=1e-6)
    (grad,) = torch.autograd.grad(kl, logp)
    # d k3 / d logp = 1 - e^delta, over 2 tokens
    assert torch.allclose(grad, torch.tensor([[(1 - 0.6065307) / 2, (1 - 2.7182818) / 2, 0.0]]), atol=1e-6)
    assert float(kl_k3(ref, ref, torch.ones(1, 3), 3)) == 0.0  # the policy at its reference: no KL


def test_kl_k3_micro_batches_sum_to_the_full_batch():
    torch.manual_seed(1)
    logp, ref = -torch.rand(4, 5), -torch.rand(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    n = int(mask.sum())
    parts = kl_k3(logp[:1], ref[:1], mask[:1], n) + kl_k3(logp[1:], ref[1:], mask[1:], n)
    assert float(parts) == pytest.approx(float(kl_k3(logp, ref, mask, n)), abs=1e-6)


def test_length_normalized_rewards_hand_computed():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    lengths = torch.tensor([[10, 20, 30], [4, 4, 4]])
    # group 0: mean length 20, relative deviations -0.5, 0, 0.5, times 0.5; group 1: equal lengths, unchanged
    expected = torch.tensor([[1.25, 2.0, 2.75], [0.5, 0.5, 0.5]])
    assert torch.allclose(length_normalized_rewards(rewards, lengths, 0.5), expected)
    assert torch.equal(length_normalized_rewards(rewards, lengths, 0.0), rewards)


def test_shuffled_rewards_permute_the_whole_batch_and_replay_from_their_generator():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.25, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # [P=3, G=4]
    shuffled = shuffled_rewards(rewards, torch.Generator().manual_seed(3))
    again = shuffled_rewards(rewards, torch.Generator().manual_seed(3))
    assert shuffled.shape == rewards.shape and torch.equal(shuffled, again)
    assert sorted(shuffled.flatten().tolist()) == sorted(rewards.flatten().tolist())  # the batch's rewards, moved
    assert not torch.equal(shuffled, rewards)
    # across groups, not within them: the flat group [1, 1, 1, 1] takes other groups' rewards
    draws = [shuffled_rewards(rewards, torch.Generator().manual_seed(s))[2] for s in range(5)]
    assert any(not torch.equal(row, rewards[2]) for row in draws)
