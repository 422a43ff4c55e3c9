"""Rollout engines behind one interface (`base.RolloutEngine`)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from stages.engines.base import Completion, RolloutEngine, SamplingParams
from stages.engines.hf import HFEngine
from stages.recipe import EngineConfig


def make_engine(cfg: EngineConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, seed: int) -> RolloutEngine:
    if cfg.kind == "hf":
        return HFEngine(model, tokenizer, batch_size=cfg.batch_size, seed=seed)
    from stages.engines.vllm import VLLMEngine  # only this path needs the server machinery

    return VLLMEngine.for_policy(cfg, model, tokenizer, seed=seed)


__all__ = ["Completion", "HFEngine", "RolloutEngine", "SamplingParams", "make_engine"]
