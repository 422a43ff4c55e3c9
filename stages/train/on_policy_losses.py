"""The on-policy losses as objects of one signature, the seam a new loss plugs into (stages/train/loss_registry.py).

An `OnPolicyLoss` maps a micro-batch's `TokenBatch` to (loss, metrics). The loss is normalized by the step's
global token count, so micro-batch losses sum to the full batch's; each metric is additive the same way (a sum
over the micro-batch divided by that count, or zero), so the stage sums it over micro-batches and ranks and logs
the total. A loss that wants a frozen reference's logprobs says so (`needs_reference`); the stage then forwards
its reference and fills `ref_logp`. The formulas are the pure functions of stages/train/losses.py.

- `GRPOLoss`: grpo_loss with an importance correction of the train/inference mismatch (none, tis or mis,
  `importance_weighting`) and, with kl_coef > 0, kl_coef * kl_k3 against the reference.
- `MOPDLoss`: mopd_loss, the truncated-importance-weighted reverse-KL policy gradient toward the teachers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch
from torch import Tensor

from cascade.stages.train.loss_registry import LossSetting
from cascade.stages.train.losses import grpo_loss, kl_k3, mis_weights, mopd_loss, tis_weights


@dataclass(frozen=True)
class TokenBatch:
    """What an on-policy loss reads of one micro-batch of n rows and C completion columns."""

    logp: Tensor  # [n, C] log pi_train of the sampled tokens, with grad
    inf_logp: Tensor  # [n, C] the engine's log pi_inf of them
    mask: Tensor  # [n, C] 1 on sampled tokens
    num_tokens: int  # sampled tokens the step's loss covers, over every micro-batch and rank
    advantages: Tensor | None = None  # [n] one per sequence (a GRPO stage)
    teacher_logp: Tensor | None = None  # [n, C] each row's teacher (a MOPD stage)
    ref_logp: Tensor | None = None  # [n, C] the frozen reference, where the loss needs_reference


class OnPolicyLoss(Protocol):
    needs_reference: bool
    metric_names: tuple[str, ...]  # the metrics every call returns, additive over micro-batches and ranks

    def __call__(self, batch: TokenBatch) -> tuple[Tensor, dict[str, float]]: ...


Weighting = Callable[[Tensor, Tensor], Tensor]  # (logp, inf_logp) [n, C] -> token weights [n, C], no grad


@dataclass(frozen=True)
class GRPOLoss:
    """L = grpo_loss(w) + kl_coef * kl_k3, w the importance weights (`weighting`; None: w = 1). Metrics:
    is_corrected (the share of tokens whose weight is not their ratio: truncated or masked) with a weighting, kl
    with kl_coef > 0."""

    weighting: Weighting | None
    kl_coef: float

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def metric_names(self) -> tuple[str, ...]:
        return ("is_corrected",) * (self.weighting is not None) + ("kl",) * self.needs_reference

    def __call__(self, batch: TokenBatch) -> tuple[Tensor, dict[str, float]]:
        logp, inf_logp, mask = batch.logp, batch.inf_logp, batch.mask
        weight = None if self.weighting is None else self.weighting(logp, inf_logp)  # [n, C]
        metrics = {}
        if weight is not None:
            with torch.no_grad():
                corrected = ((weight != torch.exp(logp - inf_logp)) * mask).sum()
            metrics["is_corrected"] = float(corrected) / batch.num_tokens
        loss = grpo_loss(logp, logp.detach(), batch.advantages, mask, batch.num_tokens, weight)
        if not self.needs_reference:
            return loss, metrics
        kl = kl_k3(logp, batch.ref_logp, mask, batch.num_tokens)
        metrics["kl"] = float(kl.detach())
        return loss + self.kl_coef * kl, metrics


@dataclass(frozen=True)
class MOPDLoss:
    """L = mopd_loss with the ratio band [eps_low, eps_high]; its metrics the stage reads off the logprobs."""

    eps_low: float
    eps_high: float
    needs_reference: bool = False
    metric_names: tuple[str, ...] = ()

    def __call__(self, batch: TokenBatch) -> tuple[Tensor, dict[str, float]]:
        loss = mopd_loss(
            batch.logp, batch.teacher_logp, batch.inf_logp, batch.mask, batch.num_tokens, self.eps_low, self.eps_high
        )
        return loss, {}


def importance_weighting(cfg: Any, engine: str, dtype: str) -> Weighting | None:
    """A GRPO stage's correction of the train/inference mismatch, (logp, inf_logp) -> token weights, or None for
    none. auto: tis where the engine is vLLM, the stage trains in bf16 or samples a step ahead (the mismatch is
    real there), else none."""
    choice = cfg.importance_correction
    if choice == "auto":
        choice = "tis" if engine == "vllm" or dtype == "bf16" or cfg.max_staleness else "none"
    if choice == "tis":
        return partial(tis_weights, cap=cfg.is_cap)
    if choice == "mis":
        return partial(mis_weights, low=cfg.mis_band[0], high=cfg.mis_band[1])
    return None


def grpo_loss_of(cfg: Any, setting: LossSetting) -> GRPOLoss:
    return GRPOLoss(importance_weighting(cfg, setting.engine, setting.dtype), cfg.kl_coef)


def mopd_loss_of(cfg: Any, setting: LossSetting) -> MOPDLoss:
    return MOPDLoss(cfg.eps_low, cfg.eps_high)


def stage_loss(cfg: Any, setting: LossSetting) -> OnPolicyLoss:
    """The loss a stage's config names (`loss:`, else its kind's own), built for where it samples and trains."""
    return cfg.loss_row().build(cfg, setting)
