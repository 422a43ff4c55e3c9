"""How the HF engine draws a row's next token: a counter-based random stream per row, and the inverse-CDF draw.

Each expanded row (prompt i, sample j) has a key, splitmix64(prompt seed i, j) (`row_keys`), and its uniform at a
decode step is output `step` of splitmix64 seeded with that key (`uniform`): a pure function of (prompt seed, j,
step), computed with int64 tensor ops on the model's device, so a row's tokens do not depend on which prompts share
its batch, on the batch size, on which rows were compacted away, or on the device (int64 wraps alike on CPU and
CUDA). `sample_next` takes the first token whose cumulative mass exceeds the row's uniform (what torch.multinomial
does, without its argument checks), or the argmax for greedy decoding.
"""

from __future__ import annotations

import torch

GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's state increment, 2**64 / golden ratio
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's output multipliers


def as_int64(x: int) -> int:
    """x mod 2**64 as a signed int64: the value int64 tensor arithmetic wraps to."""
    return (x + 2**63) % 2**64 - 2**63


def shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> on int64 is arithmetic: it copies the sign bit)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function, mod 2**64: z = (z ^ z>>>30) * MIX1; z = (z ^ z>>>27) * MIX2; z ^ z>>>31."""
    z = (z ^ shr(z, 30)) * as_int64(MIX1)
    z = (z ^ shr(z, 27)) * as_int64(MIX2)
    return z ^ shr(z, 31)


def splitmix64(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Output `index` (0-based) of splitmix64 seeded with `seed`, elementwise on int64:
    mix64(seed + (index + 1) * GOLDEN)."""
    return mix64(seed + (index + 1) * as_int64(GOLDEN))


def row_keys(prompt_seeds: torch.Tensor, n: int) -> torch.Tensor:
    """prompt_seeds: [P] int64 -> [P * n] int64, row i * n + j: key(i, j) = splitmix64(prompt_seeds[i], j)."""
    sample = torch.arange(n, device=prompt_seeds.device).repeat(len(prompt_seeds))  # [P * n]
    return splitmix64(prompt_seeds.repeat_interleave(n), sample)


def uniform(keys: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """keys: [B] int64 -> [B] float32 in [0, 1), one draw per row at this step (an int, or [B] int64: each row's
    own step): u = (mix64(key + (step + 1) * GOLDEN) mod 2**64 >>> 40) / 2**24, the top 24 bits of output `step` of
    splitmix64 seeded with the key. 24 bits: every u is exact in float32, so u < 1 and CPU and CUDA give the same
    draw. int64 tensor arithmetic wraps mod 2**64 as the host's folding does, so both forms give the same draws."""
    if isinstance(step, int):
        z = mix64(keys + as_int64((step + 1) * GOLDEN))  # the step folded in on the host: no tensor per step
    else:
        z = mix64(keys + (step + 1) * as_int64(GOLDEN))
    return shr(z, 40).float() * 2.0**-24


def sample_next(logits: torch.Tensor, lse: torch.Tensor, draw: torch.Tensor | None) -> torch.Tensor:
    """One token per row by inverse CDF. logits: [B, V] float32 of the sampling distribution (sampling_logits);
    lse: [B] their logsumexp; draw: [B] uniforms in [0, 1), None for greedy (argmax) -> [B] long."""
    if draw is None:
        return logits.argmax(-1)
    # the first token whose cumulative mass exceeds a uniform draw (zero-mass tokens, off the nucleus, never win)
    cdf = torch.exp(logits - lse[:, None]).cumsum(-1)
    target = draw[:, None].to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
