"""Sampled completions as training rows, each group's prompt forwarded once.

An RL step trains on G completions of each of P prompts. Laid out as P*G rows [prompt | completion], the
update's forward and backward would pass every prompt G times through the model. Here the distinct prompts go
through the model once (left-padded, as the rollout engine prefills them), their KV cache is repeated to the G
rows that continue them, and the completions run on that cache: the rollout engine's shared prefill, with
gradients. Gradients flow through the repeated cache into the one prompt forward, so the loss and its gradient
are those of the full rows up to float rounding (tests/stages/test_training.py). On the tiny model, 8 prompts
with completions of 8-32 tokens, the update's forward and backward ran 1.27x as fast with 20-token prompts and
G = 4, and 2.50x with 64-token prompts and G = 16 (bench/bench_update.py): the saving grows with G and with
the prompt's share of a row.

Two kinds of model run on the full rows instead, in one forward: one that cannot keep a KV cache in training
(HF activation checkpointing drops it), and an FSDP2-sharded one, whose every forward all-gathers the weights
with the other ranks (a rank with an idle micro-batch makes one forward, so a second forward per micro-batch
would leave the ranks' collectives unpaired).
Every tensor here is in completion coordinates: column j is the j-th sampled token of its row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache

from cascade.stages.engines.base import Completion
from cascade.stages.engines.hf import left_padded
from cascade.stages.losses import scoring_logits, token_logprobs


@dataclass(frozen=True)
class CompletionBatch:
    prompts: list[list[int]]  # the distinct prompts, in row order
    owner: Tensor  # [N] long: index into prompts of each row; rows of one prompt are consecutive
    ids: Tensor  # [N, C] the sampled tokens, right-padded
    mask: Tensor  # [N, C] 1.0 on sampled tokens, 0.0 on padding
    inf_logp: Tensor  # [N, C] log pi_inf of each sampled token, as the engine reported it
    temperature: float = 1.0  # what the rows were sampled with: every logprob of them is of that distribution
    top_p: float = 1.0

    def __len__(self) -> int:
        return len(self.owner)

    def to(self, device: torch.device) -> CompletionBatch:
        return replace(
            self,
            owner=self.owner.to(device),
            ids=self.ids.to(device),
            mask=self.mask.to(device),
            inf_logp=self.inf_logp.to(device),
        )

    def select(self, rows: Tensor) -> CompletionBatch:
        """The rows `rows` picks (a [N] bool mask or indices), in order; prompts are kept whole."""
        return replace(
            self, owner=self.owner[rows], ids=self.ids[rows], mask=self.mask[rows], inf_logp=self.inf_logp[rows]
        )


def completion_batch(
    pairs: list[tuple[list[int], Completion]], pad: int, temperature: float = 1.0, top_p: float = 1.0
) -> CompletionBatch:
    """(prompt, completion) rows sampled at `temperature` and `top_p` -> a CompletionBatch; consecutive rows with the
    same prompt share its entry."""
    prompts: list[list[int]] = []
    owner = []
    for prompt, _ in pairs:
        if not prompts or prompts[-1] != prompt:
            prompts.append(prompt)
        owner.append(len(prompts) - 1)
    width = max((len(c.token_ids) for _, c in pairs), default=0)
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    mask, inf_logp = torch.zeros(len(pairs), width), torch.zeros(len(pairs), width)
    for row, (_, comp) in enumerate(pairs):
        n = len(comp.token_ids)
        ids[row, :n] = torch.tensor(comp.token_ids, dtype=torch.long)
        mask[row, :n] = 1.0
        inf_logp[row, :n] = torch.tensor(comp.logprobs)
    return CompletionBatch(prompts, torch.tensor(owner, dtype=torch.long), ids, mask, inf_logp, temperature, top_p)


def completion_logprobs(model: torch.nn.Module, batch: CompletionBatch, part: slice, pad: int) -> tuple[Tensor, Tensor]:
    """log pi_{T,p}(y_j | prompt, y_<j) for the rows `part` of batch: [n, C], under the distribution they were
    sampled from (the batch's temperature and nucleus, as the engine reports pi_inf; losses.scoring_logits: a
    token outside this model's own nucleus scores a finite floor), and the model's own logits: [n, C, V]."""
    used, repeat = torch.unique_consecutive(batch.owner[part], return_inverse=True)  # [u], [n] -> used
    prompts, ids = [batch.prompts[i] for i in used.tolist()], batch.ids[part]
    if getattr(model, "is_activation_checkpointing", False) or isinstance(model, FSDPModule):
        logits = full_row_logits(model, prompts, repeat, ids, pad)
    else:
        logits = shared_prefix_logits(model, prompts, repeat, ids, pad)
    return token_logprobs(scoring_logits(logits, batch.temperature, batch.top_p), ids), logits


def shared_prefix_logits(model, prompts: list[list[int]], repeat: Tensor, ids: Tensor, pad: int) -> Tensor:
    """Each prompt forwarded once, its cache repeated to its rows. repeat: [n] row -> prompt; ids: [n, C] ->
    [n, C, V], column j the logits that predict ids[:, j]."""
    prompt_ids, prompt_mask = left_padded(prompts, pad, ids.device)
    cache = DynamicCache()
    last = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        past_key_values=cache,
        use_cache=True,
        position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
        logits_to_keep=1,
    ).logits[:, -1]  # [u, V]
    first = last[repeat, None]  # [n, 1, V]: the prompt's last position predicts y_0
    if ids.shape[1] == 1:
        return first
    cache.reorder_cache(repeat)  # [u, ...] -> [n, ...]; index_select, so gradients reach the prompt forward
    body = ids[:, :-1]  # the last token predicts nothing
    attention = torch.cat([prompt_mask[repeat], torch.ones_like(body)], dim=1)
    positions = prompt_mask.sum(-1)[repeat, None] + torch.arange(body.shape[1], device=ids.device)
    rest = model(
        input_ids=body, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
    ).logits  # [n, C-1, V]
    return torch.cat([first, rest], dim=1)


def full_row_logits(model, prompts: list[list[int]], repeat: Tensor, ids: Tensor, pad: int) -> Tensor:
    """The same logits from full [prompt | completion] rows, right-padded, one forward (no cache needed)."""
    lengths = torch.tensor([len(p) for p in prompts], device=ids.device)[repeat]  # [n]
    width = int(lengths.max()) + ids.shape[1]
    rows = torch.full((len(ids), width), pad, dtype=torch.long, device=ids.device)
    for row, prompt in enumerate(prompts[i] for i in repeat.tolist()):
        rows[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
    columns = lengths[:, None] + torch.arange(ids.shape[1], device=ids.device)  # [n, C]
    rows.scatter_(1, columns, ids)
    logits = model(input_ids=rows).logits  # [n, W, V]
    return logits.gather(1, (columns - 1)[..., None].expand(-1, -1, logits.shape[-1]))
