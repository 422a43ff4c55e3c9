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
The packed layout (`RowLayout("packed")`, GRPOConfig.update_layout) lays the [prompt | completion] rows end to
end, as SFT packs its rows (stages/train/packing.py): more tokens than the shared prefix (each prompt once per row), in
few full rows without a cache, the forward that flex attention and compiled layers make fast on a GPU.
Every tensor here is in completion coordinates: column j is the j-th sampled token of its row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import Tensor
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache

from cascade.stages.engines.hf import left_padded
from cascade.stages.engines.interface import Completion
from cascade.stages.train.losses import scoring_logits, token_logprobs
from cascade.stages.train.model import Example
from cascade.stages.train.packing import (
    PACKING_LEAK_RTOL,
    compiled_token_logprobs,
    fill_packed,
    pack_rows,
    packing_leak,
)


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


@dataclass(frozen=True)
class RowLayout:
    """How completion_logprobs lays a micro-batch's rows out for the model (GRPOConfig.update_layout): each prompt
    once on a repeated KV cache (shared_prefix) or [prompt | completion] rows in packed rows of pack_length tokens
    (None: the longest row); compiled: the logprobs' log-softmax through torch.compile (GRPOConfig.compile)."""

    kind: Literal["shared_prefix", "packed"] = "shared_prefix"
    pack_length: int | None = None
    compiled: bool = False


SHARED_PREFIX = RowLayout()


def completion_logprobs(
    model: torch.nn.Module, batch: CompletionBatch, part: slice, pad: int, layout: RowLayout = SHARED_PREFIX
) -> tuple[Tensor, Tensor]:
    """log pi_{T,p}(y_j | prompt, y_<j) for the rows `part` of batch: [n, C], under the distribution they were
    sampled from (the batch's temperature and nucleus, as the engine reports pi_inf; losses.scoring_logits: a
    token outside this model's own nucleus scores a finite floor), and the model's own logits: [n, C, V]."""
    used, repeat = torch.unique_consecutive(batch.owner[part], return_inverse=True)  # [u], [n] -> used
    prompts, ids = [batch.prompts[i] for i in used.tolist()], batch.ids[part]
    if runs_full_rows(model):
        logits = full_row_logits(model, prompts, repeat, ids, pad)
    elif layout.kind == "packed":
        logits = packed_row_logits(model, prompts, repeat, ids, batch.mask[part].sum(-1), pad, layout.pack_length)
    else:
        logits = shared_prefix_logits(model, prompts, repeat, ids, pad)
    logprobs = compiled_token_logprobs() if layout.compiled else token_logprobs
    return logprobs(scoring_logits(logits, batch.temperature, batch.top_p), ids), logits


def runs_full_rows(model: torch.nn.Module) -> bool:
    """A model that takes full rows whatever the layout: activation-checkpointed or FSDP2-sharded (above)."""
    return bool(getattr(model, "is_activation_checkpointing", False)) or isinstance(model, FSDPModule)


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


def packed_row_logits(
    model, prompts: list[list[int]], repeat: Tensor, ids: Tensor, lengths: Tensor, pad: int, pack_length: int | None
) -> Tensor:
    """The same logits from the [prompt | completion] rows laid end to end in packed rows (stages/train/packing.py:
    positions restart per row, so HF's masking keeps each row to itself), one forward without a cache. Only the
    completion positions go through the output head, so the logits are [n, C, V] as in the other layouts, not
    [R, T, V] over every prompt token too (check_head_reads_decoder: the model's logits are that head's).
    lengths: [n] sampled tokens per row; a row's last token predicts nothing and is left out; a padded column
    reads its row's last position (finite, masked out by every caller)."""
    owner, tokens, counts = repeat.tolist(), ids.tolist(), [int(n) for n in lengths.tolist()]
    rows = [prompts[p] + tokens[r][: max(counts[r] - 1, 0)] for r, p in enumerate(owner)]
    width, packed = pack_rows([len(row) for row in rows], pack_length)
    place = [(0, 0)] * len(rows)  # row -> (packed row, column of its prompt's last token)
    for k, members in enumerate(packed):
        start = 0
        for r in members:
            place[r] = (k, start + len(prompts[owner[r]]) - 1)
            start += len(rows[r])
    packed_ids, _, positions = fill_packed([Example(row, ()) for row in rows], pad, width, packed)
    hidden = model.get_decoder()(
        input_ids=packed_ids.to(ids.device), position_ids=positions.to(ids.device), use_cache=False
    ).last_hidden_state  # [R, T, H]
    at = torch.tensor(place, device=ids.device)  # [n, 2]
    last = (torch.tensor(counts, device=ids.device) - 1).clamp(min=0)  # [n]
    columns = at[:, 1:] + torch.minimum(torch.arange(ids.shape[1], device=ids.device), last[:, None])  # [n, C]
    return model.get_output_embeddings()(hidden[at[:, :1], columns])


def check_head_reads_decoder(model: torch.nn.Module, device: torch.device) -> None:
    """packed_row_logits runs the decoder and the output head apart, so that only the completion positions go
    through the head; a model whose logits are more than that (a final softcap, a logit scale) is refused before
    it trains. A 6-token probe, fp32, bounded as the packing probe is (stages/train/packing.py)."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]], device=device)
    model.eval()  # no dropout: the two forwards differ only by what runs after the decoder
    with torch.no_grad():
        whole = model(input_ids=ids, use_cache=False).logits
        hidden = getattr(model.get_decoder()(input_ids=ids, use_cache=False), "last_hidden_state", None)
        apart = None if hidden is None else model.get_output_embeddings()(hidden)
    model.train()
    if apart is None or apart.shape != whole.shape or packing_leak(whole, apart) > PACKING_LEAK_RTOL:
        raise ValueError(
            f"{type(model).__name__}: its logits are not its output head on its decoder's last hidden state "
            "(a logit softcap or scale), which the packed update reads: set update_layout: shared_prefix"
        )
