"""In-process rollout engine on Hugging Face transformers: batched, left-padded, with a KV cache.

The n samples of a prompt share one prefill: each distinct prompt of a batch is run through the model once
(HF forward, logits of the last position only), and its KV cache rows and last logits are then repeated n times
before decoding (GRPO's group_size, the difficulty filter's k). Batches hold the same rows, in the same order,
as if each prompt were repeated n times, so the sampled tokens and their logprobs are those of the repeated path.

Decoding (stages/engines/decode.py) runs a lean static-cache step over the module's own weights for the
Llama/Qwen2 family and HF's forward for any other causal LM. Rows that reached the end of turn are dropped from
the batch once they are an eighth of it, so compute follows the live rows. Per step, the sampled token's logprob
is its logit minus the row's logsumexp (no full log_softmax), and sampling draws one uniform per row against the
cumulative distribution (what torch.multinomial does, without its argument checks).

It samples from the trainer's own module, so weight sync is free and pi_inf differs from pi_train only by
batch numerics (and bf16 autocast, when training uses it). Its own torch.Generator keeps sampling
reproducible without touching the global RNG that dropout and data order use.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from cascade.stages.engines.base import Completion, SamplingParams
from cascade.stages.engines.decode import HFDecoder, LeanDecoder, lean_supported

COMPACT_SHARE = 8  # drop finished rows once they are 1/8 of the batch: each drop copies the KV cache


def left_padded(prompts: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, mask: [P, W], each prompt right-aligned after pad tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[row, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def sample_next(logits: torch.Tensor, lse: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """One token per row. logits: [B, V] float32; lse: [B] their logsumexp -> [B] long. Greedy when temperature == 0."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    if sampling.temperature == 1.0:
        probs = torch.exp(logits - lse[:, None])
    else:
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > sampling.top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # inverse CDF: the first token whose cumulative mass exceeds a uniform draw (zero-mass tokens never win)
    cdf = probs.cumsum(-1)
    draw = torch.rand(len(cdf), 1, generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, draw, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


class HFEngine:
    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, batch_size: int = 128, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)

    def generate(self, prompts: list[list[int]], n: int, sampling: SamplingParams) -> list[list[Completion]]:
        if sampling.seed is not None:
            self.generator.manual_seed(sampling.seed)
        owner = [i for i in range(len(prompts)) for _ in range(n)]  # expanded row -> prompt index
        flat: list[Completion] = []
        for start in range(0, len(owner), self.batch_size):
            rows = owner[start : start + self.batch_size]
            repeat = torch.tensor(rows) - rows[0]  # [B] -> row of the shared prefill (rows are consecutive)
            flat += self._generate_batch(prompts[rows[0] : rows[-1] + 1], repeat, sampling)
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # same process, same tensors: nothing to copy

    def close(self) -> None:
        pass

    @torch.no_grad()
    def _generate_batch(
        self, prompts: list[list[int]], repeat: torch.Tensor, sampling: SamplingParams
    ) -> list[Completion]:
        """Prefill each of `prompts` once, then decode len(repeat) rows; row r continues prompts[repeat[r]]."""
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device  # the training device; sampling stays on this CPU generator
        ids, mask = left_padded(prompts, self.tokenizer.pad_token_id, device)
        repeat = repeat.to(device)
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache,
                            **last_only).logits[:, -1]
        decoder = (LeanDecoder if lean_supported(self.model) else HFDecoder)(
            self.model, cache, repeat, mask, sampling.max_new_tokens)
        tokens, logps = self._decode(decoder, logits[repeat], position[repeat, -1], sampling)
        self.model.train(was_training)
        return self._completions(tokens, logps, self.tokenizer.eos_token_id)

    def _decode(self, decoder, logits: torch.Tensor, next_pos: torch.Tensor, sampling: SamplingParams):
        """Sample up to max_new_tokens per row. logits: [B, V] after the prompt; next_pos: [B] its last position.
        -> tokens, logps: [B, steps]; what follows a row's first eos is filler that _completions cuts."""
        eos, steps = self.tokenizer.eos_token_id, sampling.max_new_tokens
        tokens = torch.full((len(logits), steps), self.tokenizer.pad_token_id, dtype=torch.long)
        logps = torch.zeros(len(logits), steps)
        live = torch.arange(len(logits))  # decoder row -> batch row
        done = torch.zeros(len(logits), dtype=torch.bool)
        for step in range(steps):
            logits = logits.float().cpu()
            lse = logits.logsumexp(-1)
            tok = sample_next(logits, lse, sampling, self.generator)
            tokens[live, step] = tok
            logps[live, step] = logits.gather(-1, tok[:, None]).squeeze(-1) - lse
            done |= tok == eos
            if step + 1 == steps or bool(done.all()):
                break
            if int(done.sum()) * COMPACT_SHARE >= len(live):
                rows = (~done).nonzero().squeeze(-1)
                live, tok, next_pos, done = live[rows], tok[rows], next_pos[rows], done[rows]
                decoder.keep(rows.to(next_pos.device))
            next_pos = next_pos + 1
            logits = decoder.step(tok.to(next_pos.device), next_pos)
        return tokens[:, : step + 1], logps[:, : step + 1]

    def _completions(self, tokens: torch.Tensor, logps: torch.Tensor, eos: int) -> list[Completion]:
        """tokens, logps: [B, steps] -> one Completion per row, cut after the first eos."""
        result = []
        for row_tokens, row_logps in zip(tokens.tolist(), logps.tolist()):
            stop = row_tokens.index(eos) + 1 if eos in row_tokens else len(row_tokens)
            ids = row_tokens[:stop]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            reason = "stop" if ids and ids[-1] == eos else "length"
            result.append(Completion(ids, row_logps[:stop], text, reason))
        return result
