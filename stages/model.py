"""Build, load and save policy models as ordinary Hugging Face checkpoints.

`tiny` is a Qwen2-architecture causal LM built from `ModelConfig` (~3.4M parameters with the defaults) and the
committed byte-level tokenizer. Any other source is an HF model directory, loaded the same way, so a GPU
machine points the same code at a real model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from stages.recipe import ModelConfig
from stages.tokenizer import load_tokenizer

MAX_POSITIONS = 1024
hf_logging.disable_progress_bar()  # per-shard bars for a 14 MB model are noise between the stage bars


def build_tiny_model(cfg: ModelConfig, vocab_size: int, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(config)


def initial_model(cfg: ModelConfig, seed: int) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """The model a recipe starts from when no checkpoint precedes the first model stage."""
    if cfg.source == "tiny":
        tok = load_tokenizer()
        return build_tiny_model(cfg, len(tok), seed), tok
    return load_hf(cfg.source)


def load_hf(model_dir: str | Path) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    path = Path(model_dir)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"not an HF model directory (no config.json): {path}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model, load_tokenizer(path)


def save_hf(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def prompt_ids(tokenizer: PreTrainedTokenizerFast, user_text: str) -> list[int]:
    """Chat-formatted prompt ending with the assistant header; the completion follows it token for token."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def completion_ids(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    """An assistant answer as the model should emit it: the text, then the end-of-turn token."""
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def num_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
