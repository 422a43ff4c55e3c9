"""Logprobs of the distribution a rollout was sampled from: at temperature T and top-p, the engine's pi_inf and the
trainer's pi_train are both log softmax(z / T) over the nucleus (losses.sampling_logits), so an on-policy update's
train/inference ratio is 1 up to float rounding. Before, both were taken at T = 1 while sampling at T: the update
was on-policy for no defined objective."""

import math

import pytest
import torch

from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.completions import completion_batch, completion_logprobs
from cascade.stages.train.losses import (
    NUCLEUS_FLOOR_NATS,
    grpo_loss,
    mopd_loss,
    sampling_logits,
    scoring_logits,
    token_logprobs,
)
from cascade.stages.train.model import build_tiny_model, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def test_sampling_logits_by_hand():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = torch.log(p).expand(1, 4, 4)  # [B=1, T=4, V=4]: the same distribution at 4 positions
    targets = torch.arange(4)[None]  # [1, 4]: position t reads token t
    assert torch.equal(sampling_logits(z, 1.0, 1.0), z)
    # T = 0.5: softmax(z / T) is p^2 renormalized
    want = torch.log(p**2 / (p**2).sum())
    torch.testing.assert_close(token_logprobs(sampling_logits(z, 0.5, 1.0), targets)[0], want, atol=1e-6, rtol=0)
    # top_p = 0.7: the nucleus is {0.5, 0.3} (0.5 alone is short of 0.7), renormalized over its 0.8
    cut = token_logprobs(sampling_logits(z, 1.0, 0.7), targets)[0]
    assert cut[0].item() == pytest.approx(math.log(0.5 / 0.8), abs=1e-6)
    assert cut[1].item() == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)
    assert cut[2].item() == cut[3].item() == -math.inf
    # both: T = 0.5 gives 0.25, 0.09, 0.0225, 0.0025 (sum 0.365); 0.25 / 0.365 = 0.685 < 0.7, so the nucleus is 2 tokens
    both = token_logprobs(sampling_logits(z, 0.5, 0.7), targets)[0]
    assert both[1].item() == pytest.approx(math.log(0.09 / 0.34), abs=1e-6)
    # greedy has no sampling distribution: the model's own logprobs
    assert torch.equal(sampling_logits(z, 0.0, 1.0), z)


def test_a_token_outside_the_scorers_nucleus_scores_a_finite_floor_and_keeps_the_losses_finite():
    """p = (0.5, 0.3, 0.15, 0.05), top_p 0.7: the nucleus is tokens 0 and 1 (mass 0.8). Tokens 2 and 3 score
    log(0.3) - 20 (the least nucleus logit less the floor) minus the normalizer log(0.8 + 2 * 0.3 * e^-20)."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = torch.log(p).expand(1, 4, 4).clone().requires_grad_()
    targets = torch.arange(4)[None]
    scored = token_logprobs(scoring_logits(z, 1.0, 0.7), targets)[0]
    normalizer = math.log(0.8 + 2 * 0.3 * math.exp(-NUCLEUS_FLOOR_NATS))
    assert scored[0].item() == pytest.approx(math.log(0.5) - normalizer, abs=1e-6)
    assert scored[2].item() == scored[3].item() == pytest.approx(math.log(0.3) - 20 - normalizer, abs=1e-5)
    assert torch.equal(scoring_logits(z, 0.5, 1.0), sampling_logits(z, 0.5, 1.0))  # no nucleus: unchanged
    # the losses on such tokens: finite with the floor, not with -inf (the engine's own logprobs are finite)
    mask, inf_logp = torch.ones(1, 4), torch.log(p)[None]
    for logits_of in (scoring_logits, sampling_logits):
        logp = token_logprobs(logits_of(z, 1.0, 0.7), targets)  # [1, 4]
        grpo = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), mask, 4)
        mopd = mopd_loss(logp, logp.detach() - 1.0, inf_logp, mask, 4, 0.5, 2.0)
        finite = bool(torch.isfinite(grpo) and torch.isfinite(mopd))
        assert finite is (logits_of is scoring_logits)
    (grad,) = torch.autograd.grad(grpo_loss(scored[None], scored[None].detach(), torch.tensor([1.0]), mask, 4), z)
    assert torch.isfinite(grad).all()


def rollouts(temperature: float, top_p: float):
    tok = load_tokenizer()
    model = build_tiny_model(SMALL, len(tok), seed=0)
    prompts = [prompt_ids(tok, text) for text in ("What is 2+3?", "Name a colour.")]
    sampling = SamplingParams(max_new_tokens=12, temperature=temperature, top_p=top_p, seed=0)
    groups = HFEngine(model, tok).generate(prompts, 4, sampling)
    pairs = [(prompt, c) for prompt, group in zip(prompts, groups) for c in group]
    return model, tok, pairs


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (0.7, 0.9), (1.3, 1.0)])
def test_trainer_and_engine_logprobs_agree_at_the_sampling_temperature(temperature, top_p):
    model, tok, pairs = rollouts(temperature, top_p)
    batch = completion_batch(pairs, tok.pad_token_id, temperature, top_p)
    with torch.no_grad():
        train_logp, _ = completion_logprobs(model, batch, slice(None), tok.pad_token_id)
    m = batch.mask.bool()
    gap = (train_logp - batch.inf_logp)[m]
    assert gap.abs().max() < 1e-5  # the logprob mismatch
    ratio = torch.exp(gap)  # pi_train / pi_inf on every sampled token
    assert (ratio - 1).abs().max() < 1e-5
    # the old trainer, at T = 1 without the nucleus, is off by much more than rounding on these rollouts
    old = completion_batch(pairs, tok.pad_token_id)
    with torch.no_grad():
        old_logp, _ = completion_logprobs(model, old, slice(None), tok.pad_token_id)
    assert (old_logp - batch.inf_logp)[m].abs().mean() > 1e-3  # 100x the bound above (a random model: logits ~0.8)
