"""Continuous batching for the HF engine: rows that stop leave the batch and waiting rows take their slots.

A static batch runs until its longest row ends: with half of IFEval's answers looping to the token cap, most of a
batch's rows wait for the loopers. Here the batch is a fixed set of `slots`; a row that reaches its end of turn
(or the cap) frees its slot, and once an eighth of the slots are free the next waiting rows are prefilled and take
them, so each step decodes a full batch while rows wait, and a call's time follows its tokens. This is vLLM's
scheduling without its paging: each slot holds one whole sequence, its prompt's keys and values then its decoded
ones, left-aligned in a cache [slots, Hkv, width, D] per layer (width: the call's longest prompt plus its token
budget), and each row has its own length. A step writes each row's new key at that row's own column and attends
over the columns below it (an additive bias: finfo.min past a row's length); the arithmetic is LeanDecoder's
(stages/engines/decode.py), op for op, with the attention over one cache instead of a shared prefix and a
per-row part.

Prompts are prefilled right-padded in groups of at most PREFILL_TOKENS padded tokens (the prefill's attention is
quadratic in its width: a batch of long prompts prefilled at once is what once ran a 135M model's eval out of
memory), longest first, so a group's padding is small; their keys then sit at the columns the slot layout wants.
The slot count is sized to memory before anything is allocated (`plan_slots`): the cache of `batch_size` rows if
it fits in half the memory this process may still take, else as many rows as do.

Sampling is the engine's (stages/engines/sampling.py): a row's draw at its decode step is a pure function of (its key,
step), so a row samples the same tokens here as in a static batch; tests/stages/test_hf_engine.py holds it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from cascade.stages.engines.decode import after_attention, rms_norm, rotate, stacked_weights

PREFILL_TOKENS = 8192  # padded prompt tokens per prefill forward
REFILL_SHARE = 8  # admit waiting rows once this share (1/8) of the slots is free
MEMORY_SHARE = 0.5  # of the memory still available, what the KV cache may take


CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory"))  # v2 (unified) and v1's memory controller


def available_memory(meminfo: Path = Path("/proc/meminfo"), cgroup_roots: tuple[Path, ...] = CGROUP_ROOTS) -> int:
    """Bytes this process may still allocate: the least of MemAvailable and the cgroup's limit minus its usage
    (v2 memory.max / memory.current, or v1 memory.limit_in_bytes / memory.usage_in_bytes; "max" or v1's huge
    "no limit" value is no limit)."""
    candidates = []
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                candidates.append(int(line.split()[1]) * 1024)
    for limit, usage in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
        for root in cgroup_roots:
            try:
                cap, used = (root / limit).read_text().strip(), (root / usage).read_text().strip()
            except OSError:
                continue
            if cap.isdigit() and used.isdigit() and int(cap) < 1 << 60:
                candidates.append(max(0, int(cap) - int(used)))
    return min(candidates) if candidates else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class SlotPlan:
    slots: int  # rows decoded at once
    width: int  # columns per row: the longest prompt plus the token budget
    cache_bytes: int  # the KV cache of all slots
    available: int  # bytes this process could still take when planned

    def describe(self) -> str:
        gib = 2**30
        return (
            f"KV cache {self.cache_bytes / gib:.2f} GiB: {self.slots} rows x {self.width} tokens "
            f"({self.available / gib:.1f} GiB available)"
        )


def kv_bytes_per_token(config, itemsize: int) -> int:
    """Bytes of one token's keys and values in every layer of a decoder with this transformers config, `itemsize`
    bytes a number (the head size and kv heads as the Llama/Qwen2 attention derives them where the config omits
    them). The HF engine's slots and a managed vLLM server's KV cache are sized by it."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * itemsize


def plan_slots(model: torch.nn.Module, rows: int, batch_size: int, width: int, available: int) -> SlotPlan:
    """As many slots as `batch_size` (and the call's rows) allow, fewer where their cache would exceed MEMORY_SHARE
    of `available`; a MemoryError where not even one row fits."""
    per_row = kv_bytes_per_token(model.config, next(model.parameters()).element_size()) * width
    fits = int(available * MEMORY_SHARE) // per_row
    if fits < 1:
        raise MemoryError(
            f"one row of {width} tokens needs a KV cache of {per_row / 2**20:.0f} MiB; "
            f"{available / 2**20:.0f} MiB are available: lower max_new_tokens or free memory"
        )
    slots = min(batch_size, rows, fits)
    return SlotPlan(slots, width, slots * per_row, available)


class SlotDecoder:
    """Decode over a Llama/Qwen2 HF module's weights for `slots` rows, each a whole sequence left-aligned in its
    slot of a [slots, Hkv, width, D] cache per layer, with its own length (module docstring). A free slot decodes
    filler at column 0 until a row takes it; its outputs are ignored."""

    def __init__(self, model, slots: int, width: int):
        self.model = model
        parameter = next(model.parameters())
        attn = model.model.layers[0].self_attn
        shape = (slots, model.config.num_key_value_heads, width, attn.head_dim)
        # zeros, not empty: a masked column's weight is exactly 0, and 0 times uninitialized memory could be NaN
        self.keys = [parameter.new_zeros(shape) for _ in model.model.layers]
        self.values = [parameter.new_zeros(shape) for _ in model.model.layers]
        self.lengths = torch.zeros(slots, dtype=torch.long, device=parameter.device)  # filled columns per slot
        self.taken = torch.zeros(slots, dtype=torch.bool, device=parameter.device)
        self.qkv, self.gate_up = stacked_weights(model)

    def admit(self, slots: torch.Tensor, cache: DynamicCache, repeat: torch.Tensor, lengths: torch.Tensor) -> None:
        """Rows into `slots` [k]: row r continues prefilled prompt repeat[r] (right-padded in `cache`, [p, Hkv, W,
        D] per layer) of lengths[r] tokens."""
        width = cache.layers[0].keys.shape[2]
        for keys, values, prefill in zip(self.keys, self.values, cache.layers, strict=True):
            keys[slots, :, :width] = prefill.keys[repeat]
            values[slots, :, :width] = prefill.values[repeat]
        self.lengths[slots] = lengths
        self.taken[slots] = True

    def release(self, slots: torch.Tensor) -> None:
        self.lengths[slots] = 0
        self.taken[slots] = False

    def move(self, source: torch.Tensor, target: torch.Tensor) -> None:
        """The rows of slots `source` into free slots `target` (so the rows in use stay at the front)."""
        for buffer in (*self.keys, *self.values):
            buffer[target] = buffer[source]
        self.lengths[target], self.taken[target] = self.lengths[source], self.taken[source]
        self.release(source)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [b] for slots 0..b-1 -> next-token logits [b, V]."""
        used = len(tokens)
        body = self.model.model
        x = F.embedding(tokens, body.embed_tokens.weight)  # [b, H]
        cos, sin = body.rotary_emb(x, positions[:, None])  # [b, 1, D] each
        columns = self.lengths[:used]  # each row's new column
        span = int(columns.max()) + 1
        dtype = self.keys[0].dtype
        hidden = torch.arange(span, device=tokens.device)[None, :] > columns[:, None]  # [b, span]
        bias = torch.zeros(hidden.shape, dtype=dtype, device=tokens.device).masked_fill(hidden, torch.finfo(dtype).min)
        bias = bias[:, None, None, :]  # [b, 1, 1, span]
        rows = torch.arange(used, device=tokens.device)
        for layer, keys, values, qkv, gate_up in zip(body.layers, self.keys, self.values, self.qkv, self.gate_up):
            attn = layer.self_attn
            _, kv_heads, _, dim = keys.shape
            h = rms_norm(x, layer.input_layernorm)
            q, k, v = F.linear(h, *qkv).split([attn.q_proj.out_features, kv_heads * dim, kv_heads * dim], dim=-1)
            keys[rows, :, columns] = rotate(k.reshape(used, kv_heads, dim), cos, sin)
            values[rows, :, columns] = v.reshape(used, kv_heads, dim)
            q = rotate(q.reshape(used, -1, dim), cos, sin).view(used, kv_heads, -1, dim)  # [b, Hkv, g, D]
            # the g query heads of a kv head as its query rows: the fused kernel reads the strided slices in place
            out = F.scaled_dot_product_attention(
                q, keys[:used, :, :span], values[:used, :, :span], attn_mask=bias, scale=attn.scaling
            ).reshape(used, -1)  # [b, Hkv * g * D]
            x = after_attention(layer, x, out, gate_up)
        self.lengths[:used] += self.taken[:used]
        return self.model.lm_head(rms_norm(x, body.norm))


@torch.no_grad()
def prefill_right_padded(model, prompts: list[list[int]], pad: int) -> tuple[DynamicCache, torch.Tensor]:
    """One forward over `prompts`, each left-aligned and right-padded: their cache, and each prompt's
    next-token logits [p, V] (at its own last position)."""
    device = next(model.parameters()).device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    ids = torch.full((len(prompts), int(lengths.max())), pad, dtype=torch.long, device=device)
    for row, p in enumerate(prompts):
        ids[row, : len(p)] = torch.tensor(p, dtype=torch.long)
    mask = (torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]).long()
    cache = DynamicCache()
    hidden = model.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True).last_hidden_state
    last = hidden[torch.arange(len(prompts), device=device), lengths - 1]  # [p, H]
    return cache, model.lm_head(last)
