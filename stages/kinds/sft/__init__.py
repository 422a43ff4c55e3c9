"""The sft stage kind: its config, checks, estimate and row (here) and, in `run_sft.py`, its run function: supervised
fine-tuning on an sft_data stage's rows.

This folder owns the kind's whole registry row (registered below, with the checks, plan estimate and report card
it names); the row imports `run_sft.py` only on its first call: validating a recipe never loads torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from cascade.stages.kinds.registry import StageKind, register_kind
from cascade.stages.recipe.config_base import (
    BatchSize,
    Count,
    Every,
    ForwardOptions,
    Fraction,
    LearningRate,
    MicroBatched,
    Name,
    NonNegative,
    Read,
    Steps,
    TrainingConfig,
    imported_on_call,
)
from cascade.stages.recipe.estimate import StageEstimate, mean_new_tokens, training_storage


class SFTConfig(TrainingConfig, MicroBatched, ForwardOptions):
    kind: Literal["sft"] = "sft"
    name: Name = "sft"
    data: str = "sft_data"  # the sft_data stage whose dataset this trains on
    steps: Steps = 600
    batch_size: BatchSize = 32
    micro_batch_size: BatchSize = 32
    # 1e-3 after 100 warm-up steps: at 3e-3 / 30 the tiny SFT was chaotic (gradient spikes of 5-9 against a clip of
    # 1; held-out math 0.14-0.26 by seed and row order) and ended 0.7x to 0.15x as good on dev (docs/LOG.md)
    lr: LearningRate = 1e-3
    min_lr_ratio: Fraction = 0.1
    warmup_steps: Every = 100
    weight_decay: NonNegative = 0.01
    checkpoint_every: Every = 200
    # Packing lays a step's rows end to end (position ids restart per row, attention stays inside it) instead
    # of padding each to the longest: the same loss per token (tested to 1e-5), fewer tokens through the model.
    # 2.4x the padded tokens/s on a length-skewed mix (bench/RESULTS.md); micro_batch_size then counts packed rows.
    # A batch in which no two rows fit together is left exactly as padding lays it out (docs/LOG.md).
    packing: bool = True
    pack_length: Count | None = None  # tokens per packed row; None: the step's longest row (never less than it)
    # attention (sdpa | flex_attention) and compile: how the forward runs, not what it computes (ForwardOptions)
    not_hashed: ClassVar[frozenset[str]] = TrainingConfig.not_hashed | ForwardOptions.FORWARD_OPTIONS

    def reads(self) -> list[Read]:
        return [Read("data", self.data, "dataset")]


# Its registry row, and what the row names: the checks only this kind knows, its plan estimate.


def _estimate_sft(cfg: SFTConfig, recipe: Any, params: int, prompt_tokens: int) -> StageEstimate:
    trained = cfg.steps * cfg.batch_size * (prompt_tokens + int(mean_new_tokens(recipe, None)))
    return StageEstimate(cfg.name, cfg.kind, tokens_trained=trained, storage_bytes=training_storage(cfg, params))


register_kind(
    StageKind(
        "sft",
        SFTConfig,
        imported_on_call("cascade.stages.kinds.sft.run_sft", "run_sft"),
        makes="policy",
        takes_policy=True,
        holds_compute=True,
        estimate=_estimate_sft,
        distributable=True,
    )
)
