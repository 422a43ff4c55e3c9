"""Losses and advantage estimators: pure functions of tensors.

Normalization is explicit: every loss takes the global count of tokens it averages over, so the sum of
micro-batch losses equals the loss of the full batch (tested), whatever the micro-batch split.
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[target] per position, as logits[target] - logsumexp(logits): the same value without a
    [B, T, V] log-softmax tensor (kept for backward in the old form); logsumexp's backward forms the softmax itself.

    logits: [B, T, V] (position t predicts targets[:, t]); targets: [B, T] -> [B, T], float32.
    """
    logits = logits.float()
    picked = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # [B, T]
    return picked - torch.logsumexp(logits, dim=-1)


def sampling_logits(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """The logits of the distribution a sampler draws from, so that token_logprobs of them is log pi_{T,p}:

        z' = z / T  on the nucleus N,  -inf off it;
        pi_{T,p}(y) = softmax(z')[y] = softmax(z/T)[y] / sum_{v in N} softmax(z/T)[v]

    N is the smallest set of most probable tokens whose mass under softmax(z/T) reaches top_p (a token is in N when
    the mass of the tokens before it, in descending order, is at most top_p), chosen without gradient. T = 1 and
    top_p = 1 return the logits themselves; T = 0 (greedy) has no sampling distribution and is read as T = 1.
    The engine samples from it; the trainer, the reference and the teachers score with `scoring_logits`, the same
    distribution with a finite floor off the nucleus, so that their logprobs are of one objective.

    logits: [..., V] -> [..., V], float32 when transformed.
    """
    if temperature not in (0.0, 1.0):
        logits = logits.float() / temperature
    if top_p >= 1.0:
        return logits
    logits = logits.float()
    with torch.no_grad():
        sorted_p, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        inside = (sorted_p.cumsum(-1) - sorted_p) <= top_p  # [..., V] in descending order
        nucleus = torch.zeros_like(inside).scatter(-1, order, inside)
    return logits.masked_fill(~nucleus, float("-inf"))


# A token outside the scorer's nucleus scores this many nats below the nucleus's least probable token.
NUCLEUS_FLOOR_NATS = 20.0


def scoring_logits(logits: Tensor, temperature: float, top_p: float) -> Tensor:
    """sampling_logits for scoring tokens that another sampler drew (the engine, whose nucleus may differ by a
    token from the scorer's own in bf16 or across processes): off this model's nucleus N, a finite floor instead
    of -inf,

        z'_v = min_{u in N} z'_u - NUCLEUS_FLOOR_NATS  for v not in N  (the floor without gradient),

    so log pi of such a token is about its nucleus's least logprob minus 20 nats: finite, as are the losses and
    gradients built on it (-inf made grpo_loss NaN and mopd_loss -inf). The floor adds at most
    (V - |N|) e^-20 ~ 1e-4 of the least nucleus probability (V = 49,152) to the normalizer. top_p = 1 is
    sampling_logits exactly. logits: [..., V] -> [..., V]."""
    z = sampling_logits(logits, temperature, top_p)
    if top_p >= 1.0:
        return z
    off = torch.isneginf(z)
    with torch.no_grad():
        floor = z.masked_fill(off, float("inf")).amin(-1, keepdim=True) - NUCLEUS_FLOOR_NATS  # [..., 1]
    return torch.where(off, floor, z)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the predictive distribution per position. logits: [B, T, V] -> [B, T]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def sft_loss(logp: Tensor, mask: Tensor, num_tokens: int) -> Tensor:
    """Negative log-likelihood of the assistant tokens: -sum_{b,t} mask * logp / num_tokens.

    logp: [B, T] log pi(y_t); mask: [B, T] 1 on assistant tokens; num_tokens: global count of mask == 1
    over the whole optimizer batch (not this micro-batch).
    """
    return -(logp * mask).sum() / num_tokens


def grpo_advantages(rewards: Tensor, eps: float) -> Tensor:
    """Group-normalized advantage A_ij = (r_ij - mean_j r_i) / (std_j r_i + eps).

    rewards: [P, G] (P prompts, G rollouts each) -> [P, G]. std is the sample std (Bessel-corrected), as in
    DeepSeekMath's GRPO and TRL. A group whose rewards are all equal gets A = 0 (and is dropped upstream).
    """
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def shuffled_rewards(rewards: Tensor, generator: torch.Generator) -> Tensor:
    """A control for a reward's effect: the step's P*G rewards permuted across the whole batch, r'_ij = r_pi(ij).

    rewards: [P, G] -> [P, G]. The batch's reward distribution (its mean, how many groups have signal on
    average) is kept and its tie to each completion is broken: whatever a stage trained this way gains comes from
    updating at all (the sampled tokens' own likelihood, the optimizer), not from what the reward prefers.
    """
    order = torch.randperm(rewards.numel(), generator=generator)
    return rewards.flatten()[order].view_as(rewards)


def groups_with_signal(rewards: Tensor) -> Tensor:
    """Dynamic filtering: True for groups whose rewards are not all the same. rewards: [P, G] -> [P] bool."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0


def grpo_loss(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, num_tokens: int, weight: Tensor | None = None
) -> Tensor:
    """Token-level GRPO policy-gradient loss without KL.

        L = -sum_{i,t} mask_it * w_it * rho_it * A_i / num_tokens,   rho_it = exp(logp_it - old_logp_it)

    logp: [N, T] log pi_theta of the sampled tokens (with grad); old_logp: [N, T] the same under the policy
    that sampled (no grad); advantages: [N] one per sequence; mask: [N, T] 1 on completion tokens;
    num_tokens: global count of completion tokens in the optimizer batch; weight: [N, T] the importance
    correction of the train/inference mismatch (`tis_weights`, `mis_weights`; no grad), None for w = 1.
    Strictly on-policy, old_logp is logp.detach(), so rho == 1 in value and grad L = -sum mask * w * A *
    grad logp / num_tokens (REINFORCE). One update per rollout batch makes PPO clipping a no-op: not applied.
    """
    ratio = torch.exp(logp - old_logp)
    if weight is not None:
        ratio = ratio * weight
    return -(ratio * advantages.unsqueeze(-1) * mask).sum() / num_tokens


def tis_weights(logp: Tensor, inf_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling of the train/inference mismatch (Yao et al. 2025, "TIS"):

        w_t = min(sg[pi_train(y_t) / pi_inf(y_t)], cap)

    logp: [N, T] log pi_train of the sampled tokens; inf_logp: [N, T] the engine's log pi_inf of them -> [N, T]."""
    return torch.exp(logp.detach() - inf_logp).clamp(max=cap)


def mis_weights(logp: Tensor, inf_logp: Tensor, low: float, high: float) -> Tensor:
    """Masked importance sampling (IcePop; MOPD's truncation): the ratio, and 0 outside the band, not clipped:

        r_t = sg[pi_train(y_t) / pi_inf(y_t)],   w_t = r_t * 1[low <= r_t <= high]

    logp: [N, T] log pi_train of the sampled tokens; inf_logp: [N, T] the engine's log pi_inf of them -> [N, T]."""
    ratio = torch.exp(logp.detach() - inf_logp)
    return ratio * ((ratio >= low) & (ratio <= high))


def mopd_loss(
    logp: Tensor,
    teacher_logp: Tensor,
    inf_logp: Tensor,
    mask: Tensor,
    num_tokens: int,
    eps_low: float,
    eps_high: float,
) -> Tensor:
    """Multi-domain on-policy distillation loss (Nemotron-Cascade 2), on the sampled token only.

        a_t = sg[log pi_teacher(y_t) - log pi_train(y_t)]          token advantage (reverse KL)
        r_t = sg[pi_train(y_t) / pi_inf(y_t)]                      train/inference importance ratio
        w_t = r_t * 1[eps_low <= r_t <= eps_high]                  truncated: outside the band -> 0, not clipped
        L   = -sum_t mask_t * w_t * a_t * log pi_train(y_t) / num_tokens

    logp: [N, T] log pi_train of the sampled tokens (with grad); teacher_logp, inf_logp: [N, T] (no grad);
    mask: [N, T] 1 on completion tokens; num_tokens: global count of completion tokens in the optimizer batch.
    With r = 1 the gradient is the per-token policy gradient of -KL(pi_train || pi_teacher).
    """
    advantage = (teacher_logp - logp).detach()
    weight = mis_weights(logp, inf_logp, eps_low, eps_high)
    return -(mask * weight * advantage * logp).sum() / num_tokens


def truncated_fraction(logp: Tensor, inf_logp: Tensor, mask: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Share of completion tokens whose importance ratio falls outside [eps_low, eps_high]. [N, T] -> scalar."""
    ratio = torch.exp(logp.detach() - inf_logp)
    outside = ((ratio < eps_low) | (ratio > eps_high)).float()
    return (outside * mask).sum() / mask.sum().clamp(min=1)


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor, num_pairs: int, margin: float = 0.0) -> Tensor:
    """Bradley-Terry reward-model loss (InstructGPT eq. 1; Llama 2's margin variant):

        L = -sum_k log sigmoid(r_chosen_k - r_rejected_k - margin) / num_pairs

    r_chosen, r_rejected: [K] scalar rewards of K pairs of this micro-batch; num_pairs: global count of pairs in
    the optimizer batch, so micro-batch losses sum to the full batch's. logsigmoid keeps large gaps finite.
    """
    return -torch.nn.functional.logsigmoid(r_chosen - r_rejected - margin).sum() / num_pairs


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor, num_tokens: int) -> Tensor:
    """KL(pi_theta || pi_ref) by Schulman's k3 estimator on the sampled tokens (GRPO's KL term, DeepSeekMath eq. 4):

        k3_t = exp(ref_logp_t - logp_t) - (ref_logp_t - logp_t) - 1   (>= 0, unbiased for samples of pi_theta)
        KL   = sum_{i,t} mask_it * k3_it / num_tokens

    logp: [N, T] log pi_theta of the sampled tokens (with grad); ref_logp: [N, T] the frozen reference (no grad);
    mask: [N, T] 1 on completion tokens; num_tokens: global count of completion tokens in the optimizer batch.
    """
    delta = ref_logp - logp
    return ((torch.exp(delta) - delta - 1) * mask).sum() / num_tokens


def length_normalized_rewards(rewards: Tensor, lengths: Tensor, coef: float) -> Tensor:
    """A reward model's scores with the group's length trend taken out, so longer is not better by itself:

        r'_ij = r_ij - coef * (L_ij - mean_j L_ij) / mean_j L_ij

    rewards: [P, G] scalar rewards; lengths: [P, G] completion lengths in tokens -> [P, G]. coef = 0: unchanged.
    """
    mean = lengths.float().mean(dim=1, keepdim=True).clamp(min=1.0)
    return rewards - coef * (lengths.float() - mean) / mean
