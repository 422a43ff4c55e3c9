"""Decode steps for the HF engine: a lean one for the Llama/Qwen2 family, HF's own forward for everything else.

Both continue a batch whose prompts the HF module has already prefilled (HF forward, DynamicCache) and return
one row of logits per sequence per step. Both keep a preallocated attention mask instead of a `torch.cat` per
step, and both can drop finished rows (`keep`), so compute follows the live rows.

`LeanDecoder` is what vLLM does in shipping its own model code: one decode step written as the algorithm, over
the HF module's own weights (q|k|v and gate|up stacked once per batch, as vLLM stacks them at load), with a
static KV cache written in place, and the prompt's keys and values kept once per prompt rather than copied into
each of its n samples' rows (the prefix sharing vLLM does with its block tables). It skips HF's per-call machinery
(mask building, cache objects, output dataclasses, module hooks
except the `lm_head` call, which stays a module call), which is most of a small model's decode step on CPU. The
arithmetic is HF's, op for op in the same dtype (RMSNorm in float32, rotate-half RoPE from the module's own
rotary embedding, so any rope scaling it implements applies), except that the attention's sum over values is
split between the prefix and the decoded columns; tests/stages/test_hf_engine.py checks its logits against HF's
forward. `lean_supported` lists what it covers; any other model (sliding windows, other
activations, other architectures) decodes with `HFDecoder`.

`GraphDecoder` is the same step for the GPU, where the cost is elsewhere. A ~0.5B model's eager step at batch 128
on an H200 is a few hundred small kernels whose launches, and the Python that issues them, take ~20 ms, many times
what the math takes; what pays there is launching the step as one CUDA graph. A graph replays fixed shapes and fixed
addresses, so everything the step touches is static: a per-row KV cache [B, Hkv, W + room, D] per layer (W the
prefill width; each row holds its own copy of its prompt's keys and values, the "per-row layout", since the prefix
sharing's gathers change shape as prompts finish), an additive bias [B, 1, 1, W + room] (finfo.min on left
padding and on decode columns not yet written, 0 elsewhere), and the write column as an int64 device tensor that
the step advances in place. Attention runs over all W + room columns with the bias, as plain matmuls with a float32
softmax, in HF's eager order; the step holds no Python number that changes between steps and never syncs with
the host. On cuda (capture=True) each batch-size bucket (the live rows rounded up to a power of two, at most B) is
captured once, lazily, into one memory pool per decoder, after one eager warm-up on a side stream whose column and
bias writes are undone; `keep` moves the live rows to the front of every buffer, and a bucket's graph runs on the
first `bucket` rows (the outputs of rows past the live ones are ignored). Elsewhere, or with capture=False, the same
step runs eagerly, on the same bucket shapes. Python in the step (the `lm_head` call's hooks included) runs only
when a bucket is captured. On the CPU the shared prefix of `LeanDecoder` stays the choice: there the step is
bound by reading the cache, which the per-row layout repeats for each of a prompt's samples.
`graph_capturable` adds to `lean_supported` what capture needs: HF's dynamic RoPE recomputes its frequencies on
the host when a position passes its cache, which a graph cannot replay.
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


def graph_capturable(model: torch.nn.Module) -> bool:
    """lean_supported, with a RoPE whose frequencies do not depend on the positions seen (not HF's dynamic RoPE)."""
    return lean_supported(model) and "dynamic" not in str(getattr(model.model.rotary_emb, "rope_type", "default"))


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


def stacked_weights(model) -> tuple[list, list]:
    """Per layer, q|k|v and gate|up stacked as one (weight, bias) each: fewer, larger matmuls per step (a copy of
    those weights per decoder, as vLLM stacks them at load)."""
    layers = model.model.layers
    qkv = [fused(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj) for layer in layers]
    return qkv, [fused(layer.mlp.gate_proj, layer.mlp.up_proj) for layer in layers]


def after_attention(layer, x: torch.Tensor, out: torch.Tensor, gate_up) -> torch.Tensor:
    """The rest of a decoder layer, HF's op for op: x + o_proj(attention out), then x + the SiLU MLP of its norm.
    x: [B, H]; out: [B, heads * D] -> [B, H]."""
    attn, down = layer.self_attn, layer.mlp.down_proj
    x = x + F.linear(out, attn.o_proj.weight, attn.o_proj.bias)
    gate, up = F.linear(rms_norm(x, layer.post_attention_layernorm), *gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down.weight, down.bias)


class LeanDecoder:
    """Static-KV-cache decode over a Llama/Qwen2 HF module's weights, the prompt's keys and values read once per
    prompt however many samples continue it.

    cache: the prefill's DynamicCache over P prompts; repeat: [B] prompt row of each sequence, non-decreasing (a
    prompt's samples are consecutive rows); mask: [P, W] the prompts' left-padding mask; room: decode steps to
    reserve. HFDecoder takes the same arguments.

    A row's attention runs over two caches: its prompt's prefill keys [P, Hkv, W, D], kept as the prefill wrote
    them, and its own decoded keys [B, Hkv, room, D]. The softmax is taken over both sets of scores at once, so
    it is the attention over the concatenated row, op for op; only the sum over the two value sets is split.
    Decode attention is bound by reading the cache, and the prompt is most of a row's cache: with n samples a
    prompt, reading it once instead of n times is what pays (docs/LOG.md). The queries of a prompt's samples are
    laid into n slots of that prompt for the prefix's matmuls (the rows that finished leave zeros in theirs).
    """

    def __init__(self, model, cache: DynamicCache, repeat: torch.Tensor, mask: torch.Tensor, room: int):
        self.model = model
        self.owner = repeat  # [B] the prompt of each row
        self.slot = torch.arange(len(repeat), device=repeat.device) - torch.searchsorted(repeat, repeat)  # [B]
        self.samples = int(self.slot.max()) + 1 if len(repeat) else 1  # slots per prompt
        self.prefix_keys = [layer.keys for layer in cache.layers]  # [P, Hkv, W, D] each
        self.prefix_values = [layer.values for layer in cache.layers]
        self.keys = [k.new_empty(len(repeat), k.shape[1], room, k.shape[3]) for k in self.prefix_keys]
        self.values = [torch.empty_like(k) for k in self.keys]
        self.length = 0  # filled decode columns; the next token is written at this column
        dtype = self.prefix_keys[0].dtype
        # additive attention bias over each prompt's columns [P, 1, 1, W]: -inf on left padding, 0 on the prompt
        self.prefix_bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask == 0, torch.finfo(dtype).min
        )[:, None, None, :]
        self.qkv, self.gate_up = stacked_weights(model)

    def keep(self, rows: torch.Tensor) -> None:
        """Continue only `rows` (indices into the current batch); prompts left with no row leave the prefix cache."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        prompts, owner = torch.unique(self.owner[rows], return_inverse=True)
        self.owner, self.slot = owner, self.slot[rows]
        if len(prompts) < len(self.prefix_bias):
            self.prefix_keys = [k[prompts] for k in self.prefix_keys]
            self.prefix_values = [v[prompts] for v in self.prefix_values]
            self.prefix_bias = self.prefix_bias[prompts]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [B] -> next-token logits [B, V]."""
        body = self.model.model
        x = F.embedding(tokens, body.embed_tokens.weight)  # [B, H]
        cos, sin = body.rotary_emb(x, positions[:, None])  # [B, 1, D] each
        column, self.length = self.length, self.length + 1
        bias = self.prefix_bias[self.owner]  # [B, 1, 1, W]
        layers = zip(
            body.layers,
            self.prefix_keys,
            self.prefix_values,
            self.keys,
            self.values,
            self.qkv,
            self.gate_up,
            strict=True,
        )
        for layer, prefix_keys, prefix_values, keys, values, qkv, gate_up in layers:
            h = rms_norm(x, layer.input_layernorm)
            q = self._new_query(layer.self_attn, h, qkv, keys, values, column, cos, sin)  # [B, Hkv, groups, D]
            out = self._attention(layer.self_attn, q, prefix_keys, prefix_values, bias, keys, values, column)
            x = after_attention(layer, x, out, gate_up)
        return self.model.lm_head(rms_norm(x, body.norm))

    def _new_query(self, attn, h, qkv, keys, values, column: int, cos, sin) -> torch.Tensor:
        """Project h [B, H]; write the token's rotated key and its value at `column` of the decode cache; return the
        rotated query [B, Hkv, groups, D] (query head i reads kv head i // groups, as HF's repeat_kv)."""
        batch, kv_heads, _, dim = keys.shape
        q, k, v = F.linear(h, *qkv).split([attn.q_proj.out_features, kv_heads * dim, kv_heads * dim], dim=-1)
        keys[:, :, column] = rotate(k.reshape(batch, kv_heads, dim), cos, sin)
        values[:, :, column] = v.reshape(batch, kv_heads, dim)
        return rotate(q.reshape(batch, -1, dim), cos, sin).view(batch, kv_heads, -1, dim)

    def _attention(self, attn, q, prefix_keys, prefix_values, bias, keys, values, column: int) -> torch.Tensor:
        """One query per row against its prompt's prefix and its own decoded columns 0..column.
        q: [B, Hkv, g, D]; prefix_*: [P, Hkv, W, D]; keys, values: [B, Hkv, room, D] -> [B, Hkv * g * D].
        Written as plain matmuls: CPU's fused SDPA kernel took ~1.5x as long for one query row (bench/RESULTS.md)."""
        batch, kv_heads, groups, dim = q.shape
        width = prefix_keys.shape[2]
        slots = q.new_zeros(len(prefix_keys), self.samples, kv_heads, groups, dim)  # [P, n, Hkv, g, D]
        slots[self.owner, self.slot] = q
        by_prompt = slots.permute(0, 2, 1, 3, 4).reshape(len(prefix_keys), kv_heads, -1, dim)  # [P, Hkv, n*g, D]
        prefix_scores = torch.matmul(by_prompt, prefix_keys.transpose(-1, -2))  # [P, Hkv, n*g, W]
        prefix_scores = prefix_scores.view(len(prefix_keys), kv_heads, self.samples, groups, width)
        own_scores = torch.matmul(q, keys[:, :, : column + 1].transpose(-1, -2))  # [B, Hkv, g, column + 1]
        scores = torch.cat(
            [prefix_scores[self.owner, :, self.slot] * attn.scaling + bias, own_scores * attn.scaling], dim=-1
        )  # [B, Hkv, g, W + column + 1]
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        prefix_weights = torch.zeros_like(prefix_scores)  # [P, Hkv, n, g, W]
        prefix_weights[self.owner, :, self.slot] = weights[..., :width]
        from_prefix = torch.matmul(prefix_weights.view(len(prefix_keys), kv_heads, -1, width), prefix_values)
        out = from_prefix.view(len(prefix_keys), kv_heads, self.samples, groups, dim)[self.owner, :, self.slot]
        out = out + torch.matmul(weights[..., width:], values[:, :, : column + 1])  # [B, Hkv, g, D]
        return out.reshape(batch, -1)


class GraphDecoder:
    """Static-shape decode over a Llama/Qwen2 HF module's weights, each row with its own copy of its prompt's keys
    and values, the step captured as CUDA graphs on cuda (module docstring). Arguments as LeanDecoder's; capture:
    replay the step as CUDA graphs when the cache is on cuda (else, and when False, it runs eagerly). The logits a
    step returns are valid until the next step."""

    def __init__(
        self, model, cache: DynamicCache, repeat: torch.Tensor, mask: torch.Tensor, room: int, capture: bool = True
    ):
        self.model, self.room, self.steps = model, room, 0
        device = repeat.device

        def per_row(prefix: torch.Tensor) -> torch.Tensor:
            """[P, Hkv, W, D] -> [B, Hkv, W + room, D]: each row's prompt, then zeros (finite: a masked column's
            weight is exactly 0, and 0 times uninitialized memory could be NaN)."""
            return torch.cat([prefix[repeat], prefix.new_zeros(len(repeat), prefix.shape[1], room, prefix.shape[3])], 2)

        self.keys = [per_row(layer.keys) for layer in cache.layers]
        self.values = [per_row(layer.values) for layer in cache.layers]
        dtype = self.keys[0].dtype
        visible = torch.cat([mask[repeat], mask.new_zeros(len(repeat), room)], dim=1)  # [B, W + room]
        self.bias = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(
            visible == 0, torch.finfo(dtype).min
        )[:, None, None, :]  # [B, 1, 1, W + room]
        self.column = torch.full((1,), mask.shape[1], dtype=torch.long, device=device)  # the next token's column
        self.tokens = torch.zeros(len(repeat), dtype=torch.long, device=device)  # the step's inputs: valid ids
        self.positions = torch.zeros_like(self.tokens)
        self.qkv, self.gate_up = stacked_weights(model)
        self.capture = capture and device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # bucket -> (graph, its logits)

    def keep(self, rows: torch.Tensor) -> None:
        """Continue only `rows` (indices into the live rows), moved to the front of every buffer."""
        for buffer in (*self.keys, *self.values, self.bias):
            buffer[: len(rows)] = buffer[rows]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [n] of the n live rows -> next-token logits [n, V]."""
        if self.steps == self.room:  # past the cache, a write would be an out-of-bounds index on the device
            raise RuntimeError(f"the decode cache holds {self.room} steps")
        self.steps += 1
        live = len(tokens)
        bucket = min(len(self.tokens), 1 << (live - 1).bit_length())
        self.tokens[:live].copy_(tokens)
        self.positions[:live].copy_(positions)
        if not self.capture:
            return self._forward(bucket)[:live]
        with torch.cuda.device(self.column.device):
            if bucket not in self.graphs:
                self.graphs[bucket] = self._capture(bucket)
            graph, logits = self.graphs[bucket]
            graph.replay()
        return logits[:live]

    def _capture(self, bucket: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """The step on the first `bucket` rows as a CUDA graph, and the logits [bucket, V] its replays write. One
        eager warm-up on a side stream first (torch's recipe: lazy initializations stay out of the graph); the
        column and bias it advanced are restored, and the keys and values it wrote at the column are written again,
        the same, by the step that follows."""
        column, bias = self.column.clone(), self.bias[:bucket].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._forward(bucket)
        torch.cuda.current_stream().wait_stream(side)
        self.column.copy_(column)
        self.bias[:bucket].copy_(bias)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self._forward(bucket)
        return graph, logits

    def _forward(self, bucket: int) -> torch.Tensor:
        """One decode step of the first `bucket` rows, from the static inputs -> logits [bucket, V]. Writes the new
        token's key and value at the column, makes the column visible, and advances it."""
        body = self.model.model
        x = F.embedding(self.tokens[:bucket], body.embed_tokens.weight)  # [b, H]
        cos, sin = body.rotary_emb(x, self.positions[:bucket, None])  # [b, 1, D] each
        bias = self.bias[:bucket]
        bias.index_fill_(-1, self.column, 0.0)
        for layer, keys, values, qkv, gate_up in zip(
            body.layers, self.keys, self.values, self.qkv, self.gate_up, strict=True
        ):
            attn = layer.self_attn
            keys, values = keys[:bucket], values[:bucket]  # [b, Hkv, W + room, D]
            _, kv_heads, _, dim = keys.shape
            h = rms_norm(x, layer.input_layernorm)
            q, k, v = F.linear(h, *qkv).split([attn.q_proj.out_features, kv_heads * dim, kv_heads * dim], dim=-1)
            keys.index_copy_(2, self.column, rotate(k.reshape(bucket, kv_heads, dim), cos, sin)[:, :, None])
            values.index_copy_(2, self.column, v.reshape(bucket, kv_heads, 1, dim))
            q = rotate(q.reshape(bucket, -1, dim), cos, sin).view(bucket, kv_heads, -1, dim)  # [b, Hkv, g, D]
            scores = torch.matmul(q, keys.transpose(-1, -2)) * attn.scaling + bias  # [b, Hkv, g, W + room]
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
            out = torch.matmul(weights, values).reshape(bucket, -1)  # [b, Hkv * g * D]
            x = after_attention(layer, x, out, gate_up)
        self.column.add_(1)
        return self.model.lm_head(rms_norm(x, body.norm))


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
        return self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask[:, : self.length],
            position_ids=positions[:, None],
            past_key_values=self.cache,
        ).logits[:, -1]
