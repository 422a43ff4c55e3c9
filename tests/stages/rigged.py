"""A tiny model whose greedy answer to any chat prompt is "7" (or another one-token answer): real generation with
a known result.

Attention and MLP outputs are zeroed, so the residual stream is the last token's embedding, and three embedding
rows are set so that after the prompt's final "\\n" the argmax is "7", and after "7" it is the end-of-turn token.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def rig_short_answers(model, tokenizer, answer: str = "7") -> None:
    """Greedy: "\\n" -> answer (one token) -> end of turn (see the module docstring)."""
    newline, wanted, eos = tokenizer.encode("\n")[0], tokenizer.encode(answer)[0], tokenizer.eos_token_id
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        base = emb[newline].clone()
        side = torch.randn(base.shape, generator=torch.Generator().manual_seed(0))
        side -= (side @ base) / (base @ base) * base  # orthogonal to the newline embedding
        side *= base.norm() / side.norm()
        emb[wanted] = 2 * base + 3 * side  # from "\n": only the answer scores 2|base|^2
        emb[eos] = 10 * side  # from the answer: 30|side|^2 beats its own 13|side|^2


@contextmanager
def rigged_vllm_server(tmp_path_factory, model_cfg: dict, answer: str = "7") -> Iterator[str]:
    """A vLLM server (from .venv-vllm) serving a rigged tiny model; yields its root URL (the API is URL + /v1)."""
    from cascade.stages.engines.vllm import VLLMEngine
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, save_hf
    from cascade.stages.train.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    model = build_tiny_model(ModelConfig(**model_cfg), len(tokenizer), seed=0).eval()
    rig_short_answers(model, tokenizer, answer)
    model_dir = tmp_path_factory.mktemp(f"rigged-{answer}")
    save_hf(model, tokenizer, model_dir)
    engine = VLLMEngine(model_dir, workdir=tmp_path_factory.mktemp("vllm-rigged"))
    try:
        yield engine.url
    finally:
        engine.close()
