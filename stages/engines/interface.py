"""The rollout interface every engine implements (HF in-process, vLLM server, external pool).

Prompts go in as token ids that already carry the chat template, so the trainer and the engine can never
disagree on tokenization. Each completion comes back with the engine's own per-token logprob of the sampled
token (pi_inf): its log-probability under the distribution it was drawn from, the temperature and the top-p
nucleus applied and renormalized (`losses.sampling_logits`; greedy: at temperature 1). The trainer, the KL
reference and MOPD's teachers take their logprobs of the same distribution, so MOPD's importance weight and the
`logprob_mismatch` metric compare one objective's probabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

Progress = Callable[[int, int], None]  # (prompts finished, prompts in the call)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    max_new_tokens: int  # no default: each caller's budget comes from its own config (a domain's, a stage's)
    temperature: float = 1.0  # 0.0 means greedy
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # sampled tokens; ends with the stop token when finish_reason == "stop"
    logprobs: list[float]  # log pi_inf(y_t | s_t), one per token in token_ids
    text: str  # decoded without special tokens
    finish_reason: Literal["stop", "length"]


class RolloutEngine(Protocol):
    """What a stage needs from an inference engine."""

    name: str  # "hf" | "vllm"; recorded in stage metrics
    # the last weight sync's timings and logprob probe ("total_s", "probe_max_abs_diff", ...): an engine that
    # checks its weights after a sync (vLLM) fills it; one that samples the trainer's own tensors (HF) keeps it empty
    last_sync: dict[str, float]

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seeds: list[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        """n completions for each prompt; result[i][j] is sample j of prompt i. `seeds`: one per prompt, so a
        prompt's draws follow its own seed wherever it sits in the call (an eval can give each held-out item one, to
        compare checkpoints on common random numbers); None derives them from sampling.seed. Each engine's
        docstring says how it honours them. `progress(done, total)`: called as prompts finish (done: prompts
        whose n completions are all made), so a long call (a benchmark's every prompt) shows its progress."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from `model`'s current weights (on-policy after each update)."""
        ...

    def close(self) -> None: ...
