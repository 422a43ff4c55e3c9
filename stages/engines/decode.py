"""Decode steps for the HF engine: a lean one for the Llama/Qwen2 family, HF's own forward for everything else.

Both continue a batch whose prompts the HF module has already prefilled (HF forward, DynamicCache) and return
one row of logits per sequence per step. Both keep a preallocated attention mask instead of a `torch.cat` per
step, and both can drop finished rows (`keep`), so compute follows the live rows.

`LeanDecoder` is what vLLM does in shipping its own model code: one decode step written as the algorithm, over
the HF module's own weights (q|k|v and gate|up stacked once per batch, as vLLM stacks them at load), with a
static KV cache written in place. It skips HF's per-call machinery (mask building, cache objects, output dataclasses, module hooks
except the `lm_head` call, which stays a module call), which is most of a small model's decode step on CPU. The
arithmetic is HF's, op for op in the same dtype (RMSNorm in float32, rotate-half RoPE from the module's own
rotary embedding, so any rope scaling it implements applies); tests/stages/test_hf_engine.py checks its logits
against HF's forward. `lean_supported` lists what it covers; any other model (sliding windows, other
activations, other architectures) decodes with `HFDecoder`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

LEAN_MODEL_TYPES = ("llama", "qwen2")


def lean_supported(model: torch.nn.Module) -> bool:
    """A Llama/Qwen2 causal LM with full attention on every layer and a SiLU MLP."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in LEAN_MODEL_TYPES or not hasattr(model, "lm_head"):
        return False
    full_attention = all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
    return full_attention and config.hidden_act == "silu" and not getattr(config, "use_sliding_window", False)


def rms_norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """HF's Llama/Qwen2 RMSNorm: normalize in float32, cast back, then scale. x: [B, H] -> [B, H]."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [B, heads, D]; cos, sin: [B, 1, D]."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def fused(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of the linears stacked on the output axis: one F.linear computes them all."""
    biases = [lin.bias for lin in linears]
    if any(b is not None for b in biases):
        biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears]
        return torch.cat([lin.weight for lin in linears]), torch.cat(biases)
    return torch.cat([lin.weight for lin in linears]), None


class LeanDecoder:
    """Static-KV-cache decode over a Llama/Qwen2 HF module's weights.

    cache: the prefill's DynamicCache over P prompts; repeat: [B] prompt row of each sequence; mask: [P, W]
    the prompts' left-padding mask; room: decode steps to reserve. HFDecoder takes the same arguments.
    """

    def __init__(self, model, cache: DynamicCache, repeat: torch.Tensor, mask: torch.Tensor, room: int):
        self.model = model
        self.length = mask.shape[1]  # filled cache columns; the next token is written at this column
        self.keys, self.values = [], []
        for layer in cache.layers:
            for store, prefill in ((self.keys, layer.keys), (self.values, layer.values)):
                full = prefill.new_empty(len(repeat), prefill.shape[1], self.length + room, prefill.shape[3])
                full[:, :, : self.length] = prefill[repeat]
                store.append(full)
        # additive attention bias [B, 1, 1, W + room]: -inf on left padding, 0 on prompt and decoded columns
        allowed = torch.cat([mask[repeat].bool(), mask.new_ones(len(repeat), room, dtype=torch.bool)], dim=1)
        dtype = self.keys[0].dtype
        self.bias = torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(
            ~allowed, torch.finfo(dtype).min)[:, None, None, :]
        # q|k|v and gate|up as one matmul each: fewer, larger ops per layer (a copy of those weights per batch)
        self.qkv = [fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj) for layer in model.model.layers]
        self.gate_up = [fused(layer.mlp.gate_proj, layer.mlp.up_proj) for layer in model.model.layers]

    def keep(self, rows: torch.Tensor) -> None:
        """Continue only `rows` (indices into the current batch)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.bias = self.bias[rows]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [B] -> next-token logits [B, V]."""
        body = self.model.model
        x = F.embedding(tokens, body.embed_tokens.weight)  # [B, H]
        cos, sin = body.rotary_emb(x, positions[:, None])  # [B, 1, D] each
        column, self.length = self.length, self.length + 1
        for layer, keys, values, qkv, gate_up in zip(body.layers, self.keys, self.values, self.qkv, self.gate_up, strict=True):
            x = x + self._attention(layer.self_attn, rms_norm(x, layer.input_layernorm), qkv, keys, values, column, cos, sin)
            gate, up = F.linear(rms_norm(x, layer.post_attention_layernorm), *gate_up).chunk(2, dim=-1)
            down = layer.mlp.down_proj
            x = x + F.linear(F.silu(gate) * up, down.weight, down.bias)
        return self.model.lm_head(rms_norm(x, body.norm))

    def _attention(self, attn, h, qkv, keys, values, column: int, cos, sin) -> torch.Tensor:
        """One query per row against the cache. h: [B, H]; keys, values: [B, Hkv, W + room, D] -> [B, H]."""
        batch, kv_heads, _, dim = keys.shape
        q, k, v = F.linear(h, *qkv).split([attn.q_proj.out_features, kv_heads * dim, kv_heads * dim], dim=-1)
        q = rotate(q.reshape(batch, -1, dim), cos, sin)
        keys[:, :, column] = rotate(k.reshape(batch, kv_heads, dim), cos, sin)
        values[:, :, column] = v.reshape(batch, kv_heads, dim)
        # query head i reads kv head i // groups (HF's repeat_kv): the groups become the query axis. Written out,
        # since CPU's fused SDPA kernel took ~1.5x as long for one query row (bench/RESULTS.md, issue 19).
        scores = torch.matmul(q.view(batch, kv_heads, -1, dim), keys[:, :, : column + 1].transpose(-1, -2))
        weights = torch.softmax(scores * attn.scaling + self.bias[..., : column + 1], dim=-1, dtype=torch.float32)
        out = torch.matmul(weights.to(values.dtype), values[:, :, : column + 1])  # [B, Hkv, groups, D]
        return F.linear(out.reshape(batch, -1), attn.o_proj.weight, attn.o_proj.bias)


class HFDecoder:
    """Any HF causal LM: its own forward per step on the prefill's DynamicCache, the mask preallocated."""

    def __init__(self, model, cache: DynamicCache, repeat: torch.Tensor, mask: torch.Tensor, room: int):
        self.model, self.cache, self.length = model, cache, mask.shape[1]
        cache.reorder_cache(repeat)  # [P, ...] -> [B, ...]: the shared prompt prefix, one copy per sample
        self.mask = torch.cat([mask[repeat], mask.new_ones(len(repeat), room)], dim=1)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.reorder_cache(rows)
        self.mask = self.mask[rows]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.length += 1
        return self.model(input_ids=tokens[:, None], attention_mask=self.mask[:, : self.length],
                          position_ids=positions[:, None], past_key_values=self.cache).logits[:, -1]
