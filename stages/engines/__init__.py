"""Rollout engines behind one interface (`base.RolloutEngine`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import Completion, RolloutEngine, SamplingParams
from cascade.stages.recipe.sections import EngineConfig


def make_engine(
    cfg: EngineConfig,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    seed: int,
    announce: Callable[[str], None] | None = None,
) -> RolloutEngine:
    """The recipe's engine on `model`. announce: where the HF engine says, before a call that refills its rows
    starts, how many rows it decodes at once and how much memory their KV cache takes."""
    if cfg.kind == "hf":
        return HFEngine(
            model, tokenizer, batch_size=cfg.batch_size, seed=seed, decoder=cfg.hf_decoder, announce=announce
        )
    return _vllm_engine(cfg, model, tokenizer)


def _vllm_engine(cfg: EngineConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> RolloutEngine:
    """A managed vLLM server on the policy's current weights, or an external one synced to them."""
    if cfg.url:
        engine = vllm_client(cfg.url, model, tokenizer)
        engine.sync_weights(model)
        return engine
    return managed_vllm_engine(cfg, model, tokenizer)


def managed_vllm_engine(
    cfg: EngineConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, host: str | None = None
) -> RolloutEngine:
    """A vLLM server this process starts on `model`'s weights, listening on `host` (None: ServerOptions'
    loopback), and stops on close."""
    import shutil
    import tempfile
    from pathlib import Path

    from cascade.stages.engines.vllm import VLLMEngine  # only this path needs the server machinery
    from cascade.stages.train.model import end_of_turn_ids, save_hf

    model_dir = Path(tempfile.mkdtemp(prefix="cascade-policy-"))
    try:
        save_hf(model, tokenizer, model_dir)
        stop = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        return VLLMEngine(model_dir, stop_token_ids=stop, options=server_options(cfg, host), owns_model_dir=True)
    except BaseException:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise


def vllm_client(url: str, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> RolloutEngine:
    """An engine on a running vLLM server that it neither starts nor stops: the recipe's external server, or the
    one that rank 0 of a multi-rank stage manages (stages.train.rollout.SharedServerRollouts)."""
    from cascade.stages.engines.vllm import VLLMEngine
    from cascade.stages.train.model import end_of_turn_ids

    return VLLMEngine(url=url, stop_token_ids=end_of_turn_ids(tokenizer, getattr(model, "generation_config", None)))


def server_options(cfg: EngineConfig, host: str | None = None):
    """The managed server's launch options from the recipe's engine section (GPU ones apply on a GPU only)."""
    from cascade.stages.engines.vllm import ServerOptions

    on_gpu = torch.cuda.is_available()
    return ServerOptions(
        tensor_parallel_size=cfg.tensor_parallel_size,
        max_model_len=cfg.max_model_len,
        **({} if cfg.dtype == "auto" else {"dtype": cfg.dtype}),
        **({} if host is None else {"host": host}),
        **(
            {"device": "cuda", "extra_args": ("--gpu-memory-utilization", str(cfg.gpu_memory_utilization))}
            if on_gpu
            else {}
        ),
    )


__all__ = [
    "Completion",
    "HFEngine",
    "RolloutEngine",
    "SamplingParams",
    "make_engine",
    "managed_vllm_engine",
    "vllm_client",
]
