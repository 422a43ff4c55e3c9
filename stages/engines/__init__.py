"""Rollout engines behind one interface (`base.RolloutEngine`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from cascade.stages.engines.continuous import available_memory, kv_bytes_per_token
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
    """The recipe's engine on `model`. announce: where the engine says how many rows it decodes at once and how
    much memory their KV cache takes: the HF engine before each call that refills its rows, a managed vLLM server
    before it starts."""
    if cfg.kind == "hf":
        return HFEngine(
            model, tokenizer, batch_size=cfg.batch_size, seed=seed, decoder=cfg.hf_decoder, announce=announce
        )
    return _vllm_engine(cfg, model, tokenizer, announce)


def _vllm_engine(
    cfg: EngineConfig,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    announce: Callable[[str], None] | None = None,
) -> RolloutEngine:
    """A managed vLLM server on the policy's current weights, or an external one synced to them."""
    if cfg.url:
        engine = vllm_client(cfg.url, model, tokenizer)
        engine.sync_weights(model)
        return engine
    return managed_vllm_engine(cfg, model, tokenizer, announce=announce)


SERVER_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # a managed server's dtypes (engine.dtype)
KV_ROW_TOKENS = 768  # a row the automatic KV cache makes room for: a prompt and a 512-token answer
KV_MEMORY_SHARE = 0.25  # of the memory available when a CPU server starts, what its KV cache may take


def kv_cache_gib(cfg: EngineConfig, per_token: int, available: int) -> int:
    """The managed CPU server's KV cache in whole GiB: the recipe's `engine.kv_cache_gib`, else room for
    `max_num_seqs` rows of KV_ROW_TOKENS tokens of `per_token` bytes each, at most KV_MEMORY_SHARE of `available`
    bytes, and at least 1."""
    if cfg.kv_cache_gib is not None:
        return cfg.kv_cache_gib
    wanted = cfg.max_num_seqs * KV_ROW_TOKENS * per_token
    return max(1, math.ceil(min(wanted, available * KV_MEMORY_SHARE) / 2**30))


def managed_vllm_engine(
    cfg: EngineConfig,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    host: str | None = None,
    announce: Callable[[str], None] | None = None,
) -> RolloutEngine:
    """A vLLM server this process starts on `model`'s weights, listening on `host` (None: ServerOptions'
    loopback), and stops on close; `announce` is told its rows and KV cache before it starts."""
    import shutil
    import tempfile
    from pathlib import Path

    from cascade.stages.engines.vllm import VLLMEngine  # only this path needs the server machinery
    from cascade.stages.train.model import end_of_turn_ids, save_hf

    model_dir = Path(tempfile.mkdtemp(prefix="cascade-policy-"))
    try:
        save_hf(model, tokenizer, model_dir)
        stop = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        available = available_memory()
        options = server_options(cfg, model.config, available, host)
        if announce is not None:
            announce(describe_server(options, available))
        return VLLMEngine(model_dir, stop_token_ids=stop, options=options, owns_model_dir=True)
    except BaseException:
        shutil.rmtree(model_dir, ignore_errors=True)
        raise


def vllm_client(url: str, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast) -> RolloutEngine:
    """An engine on a running vLLM server that it neither starts nor stops: the recipe's external server, or the
    one that rank 0 of a multi-rank stage manages (stages.train.rollout.SharedServerRollouts)."""
    from cascade.stages.engines.vllm import VLLMEngine
    from cascade.stages.train.model import end_of_turn_ids

    return VLLMEngine(url=url, stop_token_ids=end_of_turn_ids(tokenizer, getattr(model, "generation_config", None)))


def server_options(cfg: EngineConfig, model_config, available: int, host: str | None = None):
    """The managed server's launch options from the recipe's engine section and the bytes of memory `available`
    (GPU ones apply on a GPU only; the KV cache's size on the CPU only, where a GPU sizes it by
    `gpu_memory_utilization`)."""
    from cascade.stages.engines.vllm import ServerOptions

    on_gpu = torch.cuda.is_available()
    options = ServerOptions(
        tensor_parallel_size=cfg.tensor_parallel_size,
        max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs,
        **({} if cfg.dtype == "auto" else {"dtype": cfg.dtype}),
        **({} if host is None else {"host": host}),
        **(
            {"device": "cuda", "extra_args": ("--gpu-memory-utilization", str(cfg.gpu_memory_utilization))}
            if on_gpu
            else {}
        ),
    )
    per_token = kv_bytes_per_token(model_config, SERVER_DTYPE_BYTES[options.dtype])  # the dtype the server runs in
    return dataclasses.replace(options, kv_cache_gib=kv_cache_gib(cfg, per_token, available))


def describe_server(options, available: int) -> str:
    """What a managed server will hold, said before it starts."""
    if options.device != "cpu":
        return f"vLLM server ({options.device}): up to {options.max_num_seqs} rows at once"
    return (
        f"vLLM server: up to {options.max_num_seqs} rows at once, weights in {options.dtype}, KV cache "
        f"{options.kv_cache_gib} GiB ({available / 2**30:.1f} GiB available)"
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
