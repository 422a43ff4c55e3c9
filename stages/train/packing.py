"""Packed rows, shared by the stages that train on them (SFT's batches, the GRPO update's [prompt | completion]
rows): rows laid end to end in packed rows, position ids restarting per row, so that HF's masking keeps each row
to itself; the probe that a model's mask does so; and the forward options that make packed rows fast
(`attention: flex_attention`, `compile: true`; stages/recipe/config_base.py `ForwardOptions`), with what a world refuses
of them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from cascade.stages.recipe.schema import RecipeError
from cascade.stages.scale.distributed import World, decoder_layers
from cascade.stages.train.losses import token_logprobs

if TYPE_CHECKING:
    from cascade.stages.recipe.config_base import ForwardOptions
    from cascade.stages.train.model import Example


def pack_rows(lengths: list[int], pack_length: int | None) -> tuple[int, list[list[int]]]:
    """The layout pack_batch fills: the packed rows' width, max(pack_length, longest row) (None: the longest row),
    and per packed row the indices of its rows, assigned first-fit decreasing, so the layout is a pure function of
    the lengths. Each packed row holds its rows in batch order and packed rows follow their first row's batch
    order (pack_batch says why)."""
    width = max(lengths + [pack_length or 0])
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    packed: list[list[int]] = []  # indices into the batch, per packed row
    free: list[int] = []  # tokens left per packed row
    for i in order:
        slot = next((r for r, left in enumerate(free) if left >= lengths[i]), None)
        if slot is None:
            packed.append([])
            free.append(width)
            slot = len(packed) - 1
        packed[slot].append(i)
        free[slot] -= lengths[i]
    return width, sorted(sorted(members) for members in packed)


def pack_batch(
    batch: list[Example], pad: int, pack_length: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows laid end to end into packed rows of max(pack_length, longest row) tokens (None: the longest row),
    assigned first-fit decreasing, so the layout is a pure function of the rows. Each packed row then holds its
    rows in batch order and packed rows follow their first row's batch order, so a batch in which no two rows fit
    together is the padded batch itself, row for row: a reordered batch sums its gradients in another float order,
    and at a high SFT learning rate that alone sent one 1,000-step run to a worse loss plateau (docs/LOG.md).
    A row is never split: a conversation stays whole in one packed row.
    Returns ids, loss mask and position ids, [R, T] each. Positions restart at 0 on every row; HF's masking
    (transformers >= 4.56) reads a restart as a sequence boundary and builds a block-diagonal causal mask, so no
    token attends across rows. A row's first
    token is never a target (as in padding: mask[:, 1:]), so no token is trained on the row before it. The tail
    of a packed row is padding, positions continuing the last row, masked out of the loss."""
    return fill_packed(batch, pad, *pack_rows([len(ids) for ids, _ in batch], pack_length))


def fill_packed(
    batch: list[Example], pad: int, width: int, packed: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pack_batch's tensors for a layout pack_rows made: ids, loss mask and position ids, [R, T] each."""
    ids = torch.full((len(packed), width), pad, dtype=torch.long)
    mask = torch.zeros((len(packed), width))
    positions = torch.zeros((len(packed), width), dtype=torch.long)
    for row, members in enumerate(packed):
        start = 0
        for i in members:
            tokens, trained = batch[i]
            end = start + len(tokens)
            ids[row, start:end] = torch.tensor(tokens)
            for first, last in trained:
                mask[row, start + max(first, 1) : start + last] = 1.0
            positions[row, start:end] = torch.arange(len(tokens))
            start = end
        positions[row, start:] = torch.arange(width - start) + len(batch[members[-1]][0])
    return ids, mask, positions


# The packing probe's bound on max|alone - packed| / max|alone|. fp32 reduction-order rounding measured 3e-7
# (tiny) to 6e-6 (smollm2-135m, logits up to 22); a model that attends across rows measured 0.6-1.1.
PACKING_LEAK_RTOL = 1e-3


def check_packing_isolates_rows(
    model: torch.nn.Module, device: torch.device, remedy: str = "set packing: false for this stage"
) -> None:
    """Packing is exact only if the model's attention mask reads a position-id restart as a boundary (HF's
    masking does, for every model built on its masking_utils); one that attends across rows is refused before
    it trains. A 6-token probe, fp32: the second row alone == the same row packed behind the first, up to
    rounding relative to the logits' scale (an absolute bound refuses a model whose logits are large)."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]], device=device)
    model.eval()  # no dropout: the two forwards differ only by what the mask lets through
    with torch.no_grad():
        alone = model(input_ids=ids[:, 3:], use_cache=False).logits
        packed = model(
            input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]], device=device), use_cache=False
        ).logits[:, 3:]
    model.train()
    if packing_leak(alone, packed) > PACKING_LEAK_RTOL:
        raise ValueError(
            f"{type(model).__name__} attends across packed rows (its attention mask ignores position ids): {remedy}"
        )


def packing_leak(alone: torch.Tensor, packed: torch.Tensor) -> float:
    """max|alone - packed| / max|alone|: the probe row's logits [1, T, V] alone and packed."""
    scale = alone.abs().max().clamp_min(torch.finfo(alone.dtype).tiny)
    return float((alone - packed).abs().max() / scale)


def check_forward_options(cfg: ForwardOptions, world: World) -> None:
    """Refuse, before the stage trains, what this world cannot run of its forward options: flex attention off
    cuda, compiled layers under torchrun."""
    if cfg.attention == "flex_attention" and world.device.type != "cuda":
        raise RecipeError(
            f"stage {cfg.name!r}: attention flex_attention trains on cuda only (torch has no CPU "
            "backward for it); use sdpa"
        )
    if cfg.compile and world.distributed:
        raise RecipeError(f"stage {cfg.name!r}: compile runs in one process only (one rank, compute.launcher: auto)")


@functools.cache
def compiled_token_logprobs():
    """losses.token_logprobs through torch.compile, made once per process: the log-softmax read from the bf16
    logits, no fp32 copy of [n, C, V] (SFT's loss and the GRPO update's logprobs under `compile: true`)."""
    return torch.compile(token_logprobs)


def compile_layers(model: torch.nn.Module) -> None:
    """torch.compile each decoder layer in place (its parameters keep their names): fused norms, rotary and
    activations. After any probe, whose shape would be a compile of its own."""
    for layer in decoder_layers(model):
        layer.compile()
