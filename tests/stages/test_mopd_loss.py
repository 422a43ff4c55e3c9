"""MOPD loss against hand-computed tensors."""

import math

import pytest
import torch

from cascade.stages.train.losses import mopd_loss, truncated_fraction


def leaf(values):
    return torch.tensor(values, requires_grad=True)


def test_advantage_sign_pushes_toward_the_teacher():
    logp = leaf([[math.log(0.2), math.log(0.6)]])
    teacher = torch.tensor([[math.log(0.5), math.log(0.3)]])  # teacher likes token 0 more, token 1 less
    loss = mopd_loss(logp, teacher, logp.detach(), torch.ones(1, 2), 2, 0.5, 2.0)
    loss.backward()
    # gradient descent raises logp where the teacher is more confident, lowers it where less
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]
    a = [math.log(0.5 / 0.2), math.log(0.3 / 0.6)]
    assert logp.grad[0].tolist() == pytest.approx([-a[0] / 2, -a[1] / 2], abs=1e-6)


def test_band_edges_are_inclusive_and_outside_is_zeroed_not_clipped():
    logp = leaf([[0.0, 0.0, 0.0, 0.0, 0.0]])  # log pi_train = 0 for easy ratios
    ratios = [0.5, 2.0, 0.49, 2.01, 1.0]
    inf = torch.tensor([[-math.log(r) for r in ratios]])  # r = pi_train / pi_inf
    teacher = torch.full((1, 5), -1.0)  # a_t = -1 everywhere
    loss = mopd_loss(logp, teacher, inf, torch.ones(1, 5), 5, 0.5, 2.0)
    loss.backward()
    # dL/dlogp_t = -w_t * a_t / N = w_t / 5 with w = r inside [0.5, 2.0], 0 outside
    assert logp.grad[0].tolist() == pytest.approx([0.5 / 5, 2.0 / 5, 0.0, 0.0, 1.0 / 5], abs=1e-6)
    assert truncated_fraction(logp, inf, torch.ones(1, 5), 0.5, 2.0).item() == pytest.approx(2 / 5)


def test_ratio_one_reduces_to_reverse_kl_policy_gradient():
    torch.manual_seed(0)
    logp = leaf(torch.log_softmax(torch.randn(3, 4), -1).tolist())
    teacher = torch.log_softmax(torch.randn(3, 4), -1)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    n = int(mask.sum())
    mopd_loss(logp, teacher, logp.detach(), mask, n, 0.5, 2.0).backward()
    # REINFORCE on reward -log(pi_train/pi_teacher) per token: grad = -(log teacher - log train) * mask / n
    expected = -(teacher - logp.detach()) * mask / n
    assert torch.allclose(logp.grad, expected, atol=1e-7)


def test_teacher_equal_to_student_gives_zero_advantage_and_gradient():
    logp = leaf([[-0.5, -1.5, -2.5]])
    loss = mopd_loss(logp, logp.detach().clone(), logp.detach() + 0.1, torch.ones(1, 3), 3, 0.5, 2.0)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(logp.grad) == 0


def test_micro_batches_equal_one_full_batch():
    torch.manual_seed(1)
    base = torch.log_softmax(torch.randn(6, 5), -1)
    teacher = torch.log_softmax(torch.randn(6, 5), -1)
    inf = base + 0.3 * torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).float()
    n = int(mask.sum())
    full = leaf(base.tolist())
    mopd_loss(full, teacher, inf, mask, n, 0.5, 2.0).backward()
    parts = leaf(base.tolist())
    total = 0.0
    for s in (slice(0, 2), slice(2, 5), slice(5, 6)):
        loss = mopd_loss(parts[s], teacher[s], inf[s], mask[s], n, 0.5, 2.0)
        loss.backward()
        total += loss.item()
    assert total == pytest.approx(mopd_loss(base, teacher, inf, mask, n, 0.5, 2.0).item(), abs=1e-6)
    assert torch.allclose(full.grad, parts.grad, atol=1e-7)
