"""Per-prompt seeds of a vLLM request: derived from the call's seed and the prompt's place in the whole step, so a
rank that sends a share of the prompts draws what one process would have drawn for them."""

from __future__ import annotations

import hashlib

from cascade.stages.engines.interface import SamplingParams


def _derive_seed(*parts: int) -> int:
    # 56 bits leave room for vLLM's per-sample `seed + j` without overflowing int64.
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:7], "big")


def prompt_seeds(seed: int, count: int) -> list[int]:
    """The per-prompt seeds of a call seeded by sampling.seed alone: prompt i of the call gets (seed, i). A rank
    that sends a share of a step's prompts sends its slice of the whole step's list, and so draws what one process
    would have drawn for those prompts."""
    return [_derive_seed(seed, i) for i in range(count)]


def request_seeds(count: int, sampling: SamplingParams, seeds: list[int] | None) -> list[int] | None:
    """One vLLM seed per prompt (from its own seed, else from prompt_seeds), or None when unseeded."""
    if seeds is None:
        if sampling.seed is None:
            return None
        seeds = prompt_seeds(sampling.seed, count)
    if len(seeds) != count:
        raise ValueError(f"{len(seeds)} seeds for {count} prompts")
    return [_derive_seed(s) for s in seeds]
