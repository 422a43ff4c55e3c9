"""In-process rollout engine on Hugging Face transformers: batched, left-padded, with a KV cache.

The n samples of a prompt share one prefill: each distinct prompt of a batch is run through the model once, and
its KV cache rows and last logits are then repeated n times before decoding (GRPO's group_size, the difficulty
filter's k). Batches hold the same rows, in the same order, as if each prompt were repeated n times, so the
sampled tokens and their logprobs are those of the repeated path.

It samples from the trainer's own module, so weight sync is free and pi_inf differs from pi_train only by
batch numerics (and bf16 autocast, when training uses it). Its own torch.Generator keeps sampling
reproducible without touching the global RNG that dropout and data order use.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from stages.engines.base import Completion, SamplingParams


def sample_next(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """One token per row. logits: [B, V] float32 -> [B] long. Greedy when temperature == 0."""
    if sampling.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > sampling.top_p  # keep the smallest set reaching top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


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
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        device = next(self.model.parameters()).device  # the training device; sampling stays on this CPU generator
        ids, mask, repeat = ids.to(device), mask.to(device), repeat.to(device)
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache).logits[:, -1]
        cache.reorder_cache(repeat)  # [P, ...] -> [B, ...]: the shared prompt prefix, one copy per sample
        logits, mask, next_pos = logits[repeat], mask[repeat], position[repeat, -1]
        done = torch.zeros(len(repeat), dtype=torch.bool)
        tokens, logps = [], []
        for _ in range(sampling.max_new_tokens):
            logits = logits.float().cpu()
            logp_all = torch.log_softmax(logits, dim=-1)
            tok = sample_next(logits, sampling, self.generator).masked_fill(done, pad)
            tokens.append(tok)
            logps.append(logp_all.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
            done |= tok == eos
            if bool(done.all()):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            next_pos = next_pos + 1
            out = self.model(input_ids=tok.unsqueeze(-1).to(device), attention_mask=mask, position_ids=next_pos.unsqueeze(-1), past_key_values=cache)
            logits = out.logits[:, -1]
        self.model.train(was_training)
        return self._completions(torch.stack(tokens, 1), torch.stack(logps, 1), eos)

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
