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
end of turn are dropped from the batch once they are an eighth of it, so compute follows the live rows.

A call with more rows than batch_size (an eval's every item, a difficulty filter's k samples of many prompts) on a
model on the CPU is decoded continuously on the lean step (stages/engines/continuous.py): batch_size slots, longest
prompt first; a row that stops frees its slot and, once an eighth are free, waiting rows are prefilled into them, so
the batch stays full while rows wait and a call's time follows its tokens rather than its longest row. The slots
are sized to the host's memory, and `announce` is told the plan before the cache is allocated. A call whose rows
fit one batch (a GRPO step's groups) decodes as one static batch, its prompts' keys read once for all n samples.

Per step, the sampled token's logprob is its logit minus the row's logsumexp (no full log_softmax), both of the
distribution it samples from (temperature and nucleus applied: `losses.sampling_logits`, the same function the
trainer's logprobs use), and sampling draws one uniform per row against the cumulative distribution (what
torch.multinomial does, without its argument checks).

Sampling stays on the model's device: logits, tokens and logprobs never leave it until the batch is done, and a
step syncs with the host once (how many rows have finished). Each expanded row (prompt i, sample j) draws from
its own counter-based stream, splitmix64 computed with int64 tensor ops (stages/engines/sampling.py): its draw at a
step is a pure function of (prompt seed, j, step), so a row's tokens do not depend on which prompts share its
batch, on batch_size, on which rows were compacted away, or on the device (int64 wraps alike on CPU and CUDA).
Prompt seeds come from the caller (`seeds`: an eval can give each held-out item its own, so two checkpoints are
compared on common random numbers), else from sampling.seed and the prompt's index in the call, else from the
engine's seed, continued across unseeded calls so that each draws afresh. The global RNG, which dropout and data
order use, is never touched.

It samples from the trainer's own module, so weight sync is free and pi_inf differs from pi_train only by
batch numerics (and bf16 autocast, when training uses it). An eval's engine runs on the model cast to
`eval.dtype` (stages/evals/evaluate.py: open_policy).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Callable
from functools import partial

import torch
from transformers import DynamicCache, PreTrainedTokenizerFast

from cascade.stages.engines.continuous import (
    PREFILL_TOKENS,
    REFILL_SHARE,
    SlotDecoder,
    SlotPlan,
    available_memory,
    plan_slots,
    prefill_right_padded,
)
from cascade.stages.engines.decode import GraphDecoder, HFDecoder, LeanDecoder, graph_capturable, lean_supported
from cascade.stages.engines.interface import Completion, Progress, SamplingParams
from cascade.stages.engines.sampling import as_int64, row_keys, sample_next, splitmix64, uniform
from cascade.stages.train.losses import sampling_logits
from cascade.stages.train.model import end_of_turn_ids

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


class SlotState:
    """Per slot of continuous batching: its row (-1: free), the row's decode step, the last token it took and
    that token's position (the next step feeds them), and the logits its next token is drawn from."""

    def __init__(self, slots: int, vocab: int, pad: int, device: torch.device):
        self.row = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.step = torch.zeros_like(self.row)
        self.token = torch.full_like(self.row, pad)
        self.position = torch.zeros_like(self.row)
        self.logits = torch.zeros(slots, vocab, device=device)
        self.used = 0  # slots 0..used-1 are decoded; every taken slot is below it
        self.pad = pad

    def free(self) -> torch.Tensor:
        return (self.row < 0).nonzero().squeeze(-1)

    def live(self) -> torch.Tensor:
        return (self.row[: self.used] >= 0).nonzero().squeeze(-1)

    def take(self, slots: torch.Tensor, rows: torch.Tensor, lengths: torch.Tensor, logits: torch.Tensor) -> None:
        self.row[slots], self.step[slots], self.position[slots] = rows, 0, lengths - 1
        self.logits[slots] = logits.float()
        self.used = max(self.used, int(slots.max()) + 1)

    def release(self, slots: torch.Tensor, decoder: SlotDecoder) -> None:
        self.row[slots], self.token[slots] = -1, self.pad
        decoder.release(slots)

    def compact(self, decoder: SlotDecoder) -> None:
        """Once an eighth of the decoded slots is free and no row waits, the taken ones move to the front."""
        taken = self.row[: self.used] >= 0
        count = int(taken.sum())
        if (self.used - count) * COMPACT_SHARE < self.used:
            return
        holes = (~taken[:count]).nonzero().squeeze(-1)
        movers = taken[count:].nonzero().squeeze(-1) + count
        decoder.move(movers, holes)
        for state in (self.row, self.step, self.token, self.position):
            state[holes] = state[movers]
        self.row[movers] = -1
        self.used = count

    def feed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next step's tokens and positions [used]: each taken slot's last token at the position after its
        previous one, a free slot's filler at position 0."""
        taken = self.row[: self.used] >= 0
        self.position[: self.used] += taken
        return self.token[: self.used], torch.where(taken, self.position[: self.used], 0)


class HFEngine:
    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerFast,
        batch_size: int = 128,
        seed: int = 0,
        decoder: str = "auto",
        announce: Callable[[str], None] | None = None,
    ):
        pick_decoder(model, decoder)  # refuse a decoder the model cannot take now, not at the first batch
        self.model = model
        self.decoder = decoder  # EngineConfig.hf_decoder: resolved per batch, on the model of the moment
        self.tokenizer = tokenizer
        self.stop_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self.batch_size = batch_size
        self.seed = seed
        self.unseeded = 0  # prompts drawn so far without a seed: where the engine's own seed stream continues
        self.last_plan: SlotPlan | None = None  # the slots and KV cache of the last continuous call
        self.announce = announce  # told each continuous call's plan before its cache is allocated
        self.last_sync: dict[str, float] = {}  # a sync copies nothing and checks nothing (RolloutEngine.last_sync)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seeds: list[int] | None = None,
        progress: Progress | None = None,
    ) -> list[list[Completion]]:
        keys = row_keys(self._prompt_seeds(len(prompts), sampling, seeds), n)  # [P * n]
        if self._refills() and len(prompts) * n > self.batch_size:
            flat = self._generate_continuously(prompts, n, keys, sampling, progress)
        else:
            flat = self._generate_in_batches(prompts, n, keys, sampling, progress)
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _refills(self) -> bool:
        """Continuous batching runs on the CPU's lean step; its slots are sized to the host's memory."""
        on_cpu = next(self.model.parameters()).device.type == "cpu"
        return on_cpu and pick_decoder(self.model, self.decoder) is LeanDecoder

    def _generate_in_batches(
        self, prompts: list[list[int]], n: int, keys: torch.Tensor, sampling: SamplingParams, progress
    ) -> list[Completion]:
        """Static batches of batch_size rows in prompt order, each prompt prefilled once for its n rows: where every
        row fits one batch (nothing waits to take a freed slot), or the decoder cannot take rows mid-batch."""
        owner = [i for i in range(len(prompts)) for _ in range(n)]  # expanded row -> prompt index
        flat: list[Completion] = []
        for start in range(0, len(owner), self.batch_size):
            rows = owner[start : start + self.batch_size]
            repeat = torch.tensor(rows) - rows[0]  # [B] -> row of the shared prefill (rows are consecutive)
            batch_keys = keys[start : start + len(rows)]  # [B]
            flat += self._generate_batch(prompts[rows[0] : rows[-1] + 1], repeat, batch_keys, sampling)
            if progress is not None:
                progress(len(flat) // n, len(prompts))
        return flat

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

    @torch.no_grad()
    def _generate_continuously(
        self, prompts: list[list[int]], n: int, keys: torch.Tensor, sampling: SamplingParams, progress
    ) -> list[Completion]:
        """Row i * n + j (prompt i, sample j) for every row, at most plan.slots at a time, longest prompt first: a
        row that stops frees its slot, and once an eighth of the slots is free (or none is taken) the next waiting
        rows are prefilled into them (stages/engines/continuous.py)."""
        was_training = self.model.training
        self.model.eval()
        device, steps, total = keys.device, sampling.max_new_tokens, len(prompts) * n
        plan = plan_slots(self.model, total, self.batch_size, max(map(len, prompts)) + steps, available_memory())
        self.last_plan = plan
        if self.announce is not None:
            self.announce(f"{len(prompts)} prompts x {n}: {plan.describe()}")
        decoder = SlotDecoder(self.model, plan.slots, plan.width)
        longest_first = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        waiting = deque(i * n + j for i in longest_first for j in range(n))
        pad, stop = self.tokenizer.pad_token_id, torch.tensor(self.stop_ids, device=device)
        tokens = torch.full((total, steps), pad, dtype=torch.long, device=device)
        logps = torch.zeros(total, steps, device=device)
        slot = SlotState(plan.slots, self.model.lm_head.out_features, pad, device)
        unfinished, finished_prompts = [n] * len(prompts), 0
        while True:
            free = slot.free()
            if waiting and (len(free) * REFILL_SHARE >= plan.slots or len(free) == plan.slots):
                self._admit(decoder, slot, prompts, n, [waiting.popleft() for _ in free[: len(waiting)]], free)
            live = slot.live()  # [l] slots holding a row
            rows, at = slot.row[live], slot.step[live]
            logits = sampling_logits(slot.logits[live], sampling.temperature, sampling.top_p)  # [l, V]
            lse = logits.logsumexp(-1)
            tok = sample_next(logits, lse, None if sampling.temperature == 0 else uniform(keys[rows], at))
            tokens[rows, at] = tok
            logps[rows, at] = logits.gather(-1, tok[:, None]).squeeze(-1) - lse
            slot.step[live], slot.token[live] = at + 1, tok
            ended = torch.isin(tok, stop) | (at + 1 >= steps)
            if bool(ended.any()):
                slot.release(live[ended], decoder)
                for prompt in (rows[ended] // n).tolist():
                    unfinished[prompt] -= 1
                    finished_prompts += unfinished[prompt] == 0
                if progress is not None:
                    progress(finished_prompts, len(prompts))
            if not waiting and not bool((slot.row >= 0).any()):
                break
            if not waiting:
                slot.compact(decoder)
            feed, positions = slot.feed()
            slot.logits[: len(feed)] = decoder.step(feed, positions).float()
        self.model.train(was_training)
        return self._completions(tokens, logps)

    def _admit(self, decoder: SlotDecoder, slot: SlotState, prompts, n: int, rows: list[int], free) -> None:
        """Waiting `rows` into the first len(rows) `free` slots, their prompts prefilled (right-padded) in groups of
        at most PREFILL_TOKENS padded tokens; consecutive rows of one prompt share its prefill."""
        owners = [r // n for r in rows]
        distinct = list(dict.fromkeys(owners))
        start = 0
        while start < len(distinct):
            width, end = len(prompts[distinct[start]]), start + 1  # longest first: the group's width is its first's
            while end < len(distinct) and (end - start + 1) * width <= PREFILL_TOKENS:
                end += 1
            group = distinct[start:end]
            cache, last = prefill_right_padded(self.model, [prompts[i] for i in group], self.tokenizer.pad_token_id)
            index = {prompt: k for k, prompt in enumerate(group)}
            members = [k for k, owner in enumerate(owners) if owner in index]
            targets = free[members]
            repeat = torch.tensor([index[owners[k]] for k in members], device=targets.device)
            lengths = torch.tensor([len(prompts[owners[k]]) for k in members], device=targets.device)
            decoder.admit(targets, cache, repeat, lengths)
            slot.take(targets, torch.tensor([rows[k] for k in members], device=targets.device), lengths, last[repeat])
            start = end

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
