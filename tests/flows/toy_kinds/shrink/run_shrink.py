"""The toy `shrink` kind's run function."""

from __future__ import annotations

import torch

from cascade.stages.kinds.registry import StageInputs
from cascade.stages.train.context import StageContext, StageResult, load_policy, save_model_checkpoint
from tests.flows.toy_kinds.shrink import ShrinkConfig


def run_shrink(cfg: ShrinkConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    source = inputs.stages[cfg.source]
    model, tokenizer = load_policy(ctx, source)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(cfg.factor)
    metrics = {"factor": cfg.factor}
    ref = save_model_checkpoint(ctx, ctx.key, model, tokenizer, cfg=cfg, step=None, parent=source, metrics=metrics)
    return StageResult(ref, metrics)
