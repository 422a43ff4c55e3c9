"""In-process rollout engine on Hugging Face transformers: batched, left-padded, with a KV cache.

The n samples of a prompt share one prefill: each distinct prompt of a batch is run through the model once
(HF forward, logits of the last position only), and its KV cache rows and last logits are then repeated n times
before decoding (GRPO's group_size, the difficulty filter's k). Batches hold the same rows, in the same order,
as if each prompt were repeated n times, so the sampled tokens and their logprobs are those of the repeated path.

Decoding (stages/engines/decode.py) runs a lean static-cache step over the module's own weights for the Llama/Qwen2
family and HF's forward for any other causal LM. `decoder` (the recipe's engine.hf_decoder) picks the lean step's
layout: on the CPU by default the shared prefix (`LeanDecoder`), which reads each prompt's prefilled keys and values
once for all n of its samples; on cuda by default a per-row cache whose step is captured as CUDA graphs
(`GraphDecoder`: a GPU's eager step is bound by kernel launches, not by reading the cache). Rows that reached the
end of turn are dropped from the batch once they are an eighth of it, so compute follows the live rows. Per step,
the sampled token's logprob is its logit minus the row's logsumexp (no full log_softmax), both of the distribution
it samples from (temperature and nucleus applied: `losses.sampling_logits`, the same function the trainer's logprobs
use), and sampling draws one uniform per row against the cumulative distribution (what torch.multinomial does,
without its argument checks).

Sampling stays on the model's device: logits, tokens and logprobs never leave it until the batch is done, and a
step syncs with the host once (how many rows have finished). Each expanded row (prompt i, sample j) draws from
its own counter-based stream, splitmix64 computed with int64 tensor ops (`uniform`, `row_keys`): its draw at a
step is a pure function of (prompt seed, j, step), so a row's tokens do not depend on which prompts share its
batch, on batch_size, on which rows were compacted away, or on the device (int64 wraps alike on CPU and CUDA).
Prompt seeds come from the caller (`seeds`: an eval can give each held-out item its own, so two checkpoints are
compared on common random numbers), else from sampling.seed and the prompt's index in the call, else from the
engine's seed, continued across unseeded calls so that each draws afresh. The global RNG, which dropout and data
order use, is never touched.

It samples from the trainer's own module, so weight sync is free and pi_inf differs from pi_train only by
batch numerics (and bf16 autocast, when training uses it).
"""

from __future__ import annotations

import inspect
from functools import partial

import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from cascade.stages.engines.decode import GraphDecoder, HFDecoder, LeanDecoder, graph_capturable, lean_supported
from cascade.stages.engines.interface import Completion, SamplingParams
from cascade.stages.train.losses import sampling_logits
from cascade.stages.train.model import end_of_turn_ids

COMPACT_SHARE = 8  # drop finished rows once they are 1/8 of the batch: each drop copies the KV cache
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's state increment, 2**64 / golden ratio
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's output multipliers


def as_int64(x: int) -> int:
    """x mod 2**64 as a signed int64: the value int64 tensor arithmetic wraps to."""
    return (x + 2**63) % 2**64 - 2**63


def shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's >> on int64 is arithmetic: it copies the sign bit)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function, mod 2**64: z = (z ^ z>>>30) * MIX1; z = (z ^ z>>>27) * MIX2; z ^ z>>>31."""
    z = (z ^ shr(z, 30)) * as_int64(MIX1)
    z = (z ^ shr(z, 27)) * as_int64(MIX2)
    return z ^ shr(z, 31)


def splitmix64(seed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Output `index` (0-based) of splitmix64 seeded with `seed`, elementwise on int64:
    mix64(seed + (index + 1) * GOLDEN)."""
    return mix64(seed + (index + 1) * as_int64(GOLDEN))


def row_keys(prompt_seeds: torch.Tensor, n: int) -> torch.Tensor:
    """prompt_seeds: [P] int64 -> [P * n] int64, row i * n + j: key(i, j) = splitmix64(prompt_seeds[i], j)."""
    sample = torch.arange(n, device=prompt_seeds.device).repeat(len(prompt_seeds))  # [P * n]
    return splitmix64(prompt_seeds.repeat_interleave(n), sample)


def uniform(keys: torch.Tensor, step: int) -> torch.Tensor:
    """keys: [B] int64 -> [B] float32 in [0, 1), one draw per row at this step:
    u = (mix64(key + (step + 1) * GOLDEN) mod 2**64 >>> 40) / 2**24, the top 24 bits of output `step` of splitmix64
    seeded with the key. 24 bits: every u is exact in float32, so u < 1 and CPU and CUDA give the same draw."""
    z = mix64(keys + as_int64((step + 1) * GOLDEN))  # the step folded in on the host: no tensor per step
    return shr(z, 40).float() * 2.0**-24


def left_padded(prompts: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask: [P, W], each prompt right-aligned after pad tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def sample_next(logits: torch.Tensor, lse: torch.Tensor, draw: torch.Tensor | None) -> torch.Tensor:
    """One token per row by inverse CDF. logits: [B, V] float32 of the sampling distribution (sampling_logits);
    lse: [B] their logsumexp; draw: [B] uniforms in [0, 1), None for greedy (argmax) -> [B] long."""
    if draw is None:
        return logits.argmax(-1)
    # the first token whose cumulative mass exceeds a uniform draw (zero-mass tokens, off the nucleus, never win)
    cdf = torch.exp(logits - lse[:, None]).cumsum(-1)
    target = draw[:, None].to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


def pick_decoder(model: torch.nn.Module, choice: str):
    """The decoder class (called as LeanDecoder is) that `choice`, EngineConfig.hf_decoder, means for `model`.
    auto: cuda_graphs on a cuda model the lean step covers (per_row if its RoPE cannot be captured), shared_prefix
    on the CPU, hf for any other model. A choice the model cannot take is a ValueError."""
    lean, device = lean_supported(model), next(model.parameters()).device
    if choice == "auto":
        if not lean:
            return HFDecoder
        if device.type != "cuda":
            return LeanDecoder
        choice = "cuda_graphs" if graph_capturable(model) else "per_row"
    if choice == "hf":
        return HFDecoder
    if choice not in ("shared_prefix", "per_row", "cuda_graphs"):
        raise ValueError(f"unknown hf_decoder {choice!r}: auto, shared_prefix, per_row, cuda_graphs or hf")
    if not lean:
        raise ValueError(
            f"hf_decoder {choice} needs a Llama/Qwen2 model with full attention and a SiLU MLP; "
            f"this {getattr(model.config, 'model_type', type(model).__name__)} decodes with hf"
        )
    if choice == "shared_prefix":
        return LeanDecoder
    if choice == "per_row":
        return partial(GraphDecoder, capture=False)
    if device.type != "cuda":
        raise ValueError(f"hf_decoder cuda_graphs needs a cuda model; this one is on {device}")
    if not graph_capturable(model):
        raise ValueError("hf_decoder cuda_graphs cannot capture a dynamic RoPE (its frequencies change on the host)")
    return GraphDecoder


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerFast,
        batch_size: int = 128,
        seed: int = 0,
        decoder: str = "auto",
    ):
        pick_decoder(model, decoder)  # refuse a decoder the model cannot take now, not at the first batch
        self.model = model
        self.decoder = decoder  # EngineConfig.hf_decoder: resolved per batch, on the model of the moment
        self.tokenizer = tokenizer
        self.stop_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self.batch_size = batch_size
        self.seed = seed
        self.unseeded = 0  # prompts drawn so far without a seed: where the engine's own seed stream continues

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingParams, seeds: list[int] | None = None
    ) -> list[list[Completion]]:
        keys = row_keys(self._prompt_seeds(len(prompts), sampling, seeds), n)  # [P * n]
        owner = [i for i in range(len(prompts)) for _ in range(n)]  # expanded row -> prompt index
        flat: list[Completion] = []
        for start in range(0, len(owner), self.batch_size):
            rows = owner[start : start + self.batch_size]
            repeat = torch.tensor(rows) - rows[0]  # [B] -> row of the shared prefill (rows are consecutive)
            batch_keys = keys[start : start + len(rows)]  # [B]
            flat += self._generate_batch(prompts[rows[0] : rows[-1] + 1], repeat, batch_keys, sampling)
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # same process, same tensors: nothing to copy

    def close(self) -> None:
        pass

    def _prompt_seeds(self, count: int, sampling: SamplingParams, seeds: list[int] | None) -> torch.Tensor:
        """[count] int64 on the model's device: the caller's seeds, else outputs 0..count-1 of splitmix64 seeded
        with sampling.seed, else the next `count` outputs of the engine's own stream (each unseeded call is new)."""
        device = next(self.model.parameters()).device
        if seeds is not None:
            if len(seeds) != count:
                raise ValueError(f"{len(seeds)} seeds for {count} prompts")
            return torch.tensor([as_int64(s) for s in seeds], dtype=torch.long, device=device)
        if sampling.seed is not None:
            base, first = sampling.seed, 0
        else:
            base, first = self.seed, self.unseeded
            self.unseeded += count
        index = torch.arange(first, first + count, device=device)
        return splitmix64(torch.full_like(index, as_int64(base)), index)

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], repeat: torch.Tensor, keys: torch.Tensor, sampling: SamplingParams
    ) -> list[Completion]:
        """Prefill each of `prompts` once, then decode len(repeat) rows; row r continues prompts[repeat[r]] and
        draws from stream keys[r]."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        ids, mask = left_padded(prompts, self.tokenizer.pad_token_id, device)
        repeat = repeat.to(device)
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        last_only = (
            {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        )
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache, **last_only
        ).logits[:, -1]
        decoder = pick_decoder(self.model, self.decoder)(self.model, cache, repeat, mask, sampling.max_new_tokens)
        tokens, logps = self._decode(decoder, logits[repeat], position[repeat, -1], keys, sampling)
        self.model.train(was_training)
        return self._completions(tokens, logps)

    def _decode(
        self, decoder, logits: torch.Tensor, next_pos: torch.Tensor, keys: torch.Tensor, sampling: SamplingParams
    ):
        """Sample up to max_new_tokens per row, on the logits' device. logits: [B, V] after the prompt; next_pos:
        [B] its last position; keys: [B] the rows' streams. -> tokens, logps: [B, steps] on that device; what
        follows a row's first eos is filler that _completions cuts."""
        steps, device = sampling.max_new_tokens, logits.device
        stop = torch.tensor(self.stop_ids, device=device)
        tokens = torch.full((len(logits), steps), self.tokenizer.pad_token_id, dtype=torch.long, device=device)
        logps = torch.zeros(len(logits), steps, device=device)
        live = torch.arange(len(logits), device=device)  # decoder row -> batch row
        done = torch.zeros(len(logits), dtype=torch.bool, device=device)
        for step in range(steps):
            logits = sampling_logits(logits.float(), sampling.temperature, sampling.top_p)  # [B, V]
            lse = logits.logsumexp(-1)  # [B]
            draw = None if sampling.temperature == 0 else uniform(keys, step)  # [B]
            tok = sample_next(logits, lse, draw)  # [B]
            tokens[live, step] = tok
            logps[live, step] = logits.gather(-1, tok[:, None]).squeeze(-1) - lse  # log pi_{T,p}: what was sampled
            done |= torch.isin(tok, stop)
            if step + 1 == steps:
                break
            finished = int(done.sum())  # the step's one host sync
            if finished == len(live):
                break
            if finished * COMPACT_SHARE >= len(live):
                rows = torch.nonzero_static(~done, size=len(live) - finished).squeeze(-1)  # size known: no sync
                live, tok, next_pos, keys, done = live[rows], tok[rows], next_pos[rows], keys[rows], done[rows]
                decoder.keep(rows)
            next_pos = next_pos + 1
            logits = decoder.step(tok, next_pos)
        return tokens[:, : step + 1], logps[:, : step + 1]

    def _completions(self, tokens: torch.Tensor, logps: torch.Tensor) -> list[Completion]:
        """tokens, logps: [B, steps] -> one Completion per row, cut after its first end-of-turn id."""
        stops = set(self.stop_ids)
        result = []
        for row_tokens, row_logps in zip(tokens.cpu().tolist(), logps.cpu().tolist()):
            end = next((i + 1 for i, t in enumerate(row_tokens) if t in stops), len(row_tokens))
            ids = row_tokens[:end]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            reason = "stop" if ids and ids[-1] in stops else "length"
            result.append(Completion(ids, row_logps[:end], text, reason))
        return result
