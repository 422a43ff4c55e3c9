"""Throughput profiles of `cascade plan`: what one device achieves in training and sampling, turned into a
stage's seconds. The `cpu` profile is measured on this project's 2-core host on two models (bench/RESULTS.md); the
GPU profiles are a card's dense bf16 peak times an assumed utilization."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cascade.stages.recipe.estimate import StageEstimate
    from cascade.stages.recipe.plan import ModelSize


@dataclass(frozen=True)
class Measured:
    """Tokens/s measured on one model on a profile's device (bench/bench_throughput.py)."""

    params: float
    train_tokens_per_s: float
    sample_tokens_per_s: float


@dataclass(frozen=True)
class Throughput:
    """Effective FLOP/s of one device: what a real step achieves, not the datasheet's peak. Either one figure at
    every model size (the GPU profiles), or tokens/s measured on models of a few sizes (the cpu profile)."""

    name: str
    basis: str  # where the figures come from, printed under the table
    train_flops: float = 0.0
    sample_flops: float = 0.0
    measured: tuple[Measured, ...] = ()  # by size, smallest first

    def flops(self, params: float) -> tuple[float, float]:
        """Effective training and sampling FLOP/s on a model of `params`: the fixed figures, or the measured ones
        (6 N x train tok/s, 2 N x sample tok/s) interpolated in log size between the two nearest measurements,
        the nearest one's outside them: a CPU's matmuls use it better as the model grows, up to a point."""
        if not self.measured:
            return self.train_flops, self.sample_flops
        at = [
            (m.params, 6 * m.params * m.train_tokens_per_s, 2 * m.params * m.sample_tokens_per_s) for m in self.measured
        ]
        if params <= at[0][0]:
            return at[0][1], at[0][2]
        for (n0, t0, s0), (n1, t1, s1) in zip(at, at[1:]):
            if params <= n1:
                w = math.log(params / n0) / math.log(n1 / n0)
                return t0 ** (1 - w) * t1**w, s0 ** (1 - w) * s1**w
        return at[-1][1], at[-1][2]

    def ceilings(self) -> tuple[float | None, float | None]:
        """Token rates no model beats, training and sampling: the smallest measured model's, where per-token
        overhead dominates; None for the FLOP-only profiles."""
        if not self.measured:
            return None, None
        return self.measured[0].train_tokens_per_s, self.measured[0].sample_tokens_per_s


_H100_BF16 = 989e12  # dense bf16 peak of an H100 SXM (the H200 has the same compute)
PROFILES = {
    "cpu": Throughput(
        "cpu",
        "2 CPU cores, measured (bench/bench_throughput.py): the tiny model (3.4M) SFT 8,552 tok/s, HF engine "
        "4,700 tok/s (also the ceilings); smollm2-135m SFT 397 tok/s (bf16), HF engine 199 tok/s "
        "(fp32); between them interpolated in log size",
        measured=(Measured(3.4e6, 8552, 4700), Measured(134.5e6, 397, 199)),
    ),
    "h100": Throughput(
        "h100",
        "H100 bf16 peak 989 TFLOP/s x assumed utilization 40% training, 10% sampling (decode)",
        0.40 * _H100_BF16,
        0.10 * _H100_BF16,
    ),
    "h200": Throughput(
        "h200",
        "H200 bf16 peak 989 TFLOP/s x assumed utilization 40% training, 13% sampling "
        "(more memory bandwidth for decode)",
        0.40 * _H100_BF16,
        0.13 * _H100_BF16,
    ),
}


def seconds(est: StageEstimate, size: ModelSize, profile: Throughput, devices: int) -> float:
    """Training 6N per token; teacher forwards 2N at training efficiency (whole sequences at once); sampling
    2N per token at decode efficiency."""
    train_flops, sample_flops = profile.flops(size.active)
    train_s = (6 * est.tokens_trained + 2 * est.teacher_tokens) * size.active / train_flops
    sample_s = 2 * size.active * est.tokens_sampled / sample_flops
    max_train, max_sample = profile.ceilings()
    if max_train:
        train_s = max(train_s, (est.tokens_trained + est.teacher_tokens / 3) / max_train)
    if max_sample:
        sample_s = max(sample_s, est.tokens_sampled / max_sample)
    return (train_s + sample_s) / devices
