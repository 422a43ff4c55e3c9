"""Supervised fine-tuning on the sft_data stage's chat rows (its Parquet shards), loss on assistant tokens only.

Nemotron-Cascade SFT (arXiv 2512.13607 sec. 3): next-token NLL over the teacher's response tokens,

    L = -(1 / N_resp) * sum_{b,t} 1[t in response_b] * log pi(y_t | y_<t),

with N_resp the response-token count of the whole optimizer batch, so micro-batching does not change it. A row
may be a multi-turn conversation (system, user, assistant and tool turns): then every assistant turn is a response,
its tokens found through the tokenizer's chat template (stages/train/model.py `conversation_example`), and the other
turns are context.
Deviations: AdamW (0.9, 0.95), warm-up then cosine to 10%, and bf16 autocast where this host runs it faster
(`compute.dtype: auto`, stages/train/precision.py); under torchrun each rank takes a contiguous share of every
batch's rows and the token count is all-reduced (stages/scale/distributed.py); batches are sampled from a per-epoch
seeded permutation, so the data position is just the step number and a resumed stage sees exactly the batches
it would have seen. Packing (on by default, `packing: false` pads instead; docs/RECIPES.md) lays a step's rows
end to end with position ids restarting per row and attention kept inside each: the same loss per token as
padding, without the padding's compute; the layout is a pure function of the step's rows, so resume parity
holds packed too. On a GPU, `attention: flex_attention` (block-sparse over the packed rows) and `compile: true`
change how the step runs, not what it computes (docs/RECIPES.md).
"""

from __future__ import annotations

import time

import torch

from cascade.artifacts.checkpoint import CheckpointRef, materialize
from cascade.stages.datasets.shards import DATA_DIR, iter_conversations, shard_paths
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft import SFTConfig
from cascade.stages.recipe.schema import RecipeError
from cascade.stages.scale.distributed import World
from cascade.stages.train.context import StageContext, StageResult
from cascade.stages.train.losses import sft_loss, token_logprobs
from cascade.stages.train.model import Example, conversation_example
from cascade.stages.train.packing import (
    check_forward_options,
    check_packing_isolates_rows,
    compile_layers,
    compiled_token_logprobs,
    pack_batch,
)
from cascade.stages.train.training import TrainRun, backward_micro_batches, batch_for_step, clip_and_step, warmup_cosine


def run_sft(cfg: SFTConfig, ctx: StageContext, inputs: StageInputs) -> StageResult:
    """Trains inputs.policy on the dataset of the sft_data stage cfg.data names."""
    started = time.time()
    run = TrainRun(ctx, cfg, inputs.policy)
    check_world(cfg, run.world)
    examples = load_examples(ctx, inputs.stages[cfg.data], run.tokenizer)
    if not examples:  # e.g. every row dropped by the filters: its data card says why
        raise RecipeError(f"stage {cfg.name!r}: the dataset of stage {cfg.data!r} has no rows to train on")
    pad = run.tokenizer.pad_token_id
    world, device = run.world, run.world.device
    run.model.set_attn_implementation(cfg.attention)
    if cfg.packing:
        check_packing_isolates_rows(run.model, device)
    if cfg.compile:  # after the packing probe, whose 6-token shape would be a compile of its own
        compile_layers(run.model)
    logprobs = compiled_token_logprobs() if cfg.compile else token_logprobs
    tokens_seen = 0
    loss = 0.0
    while run.step < cfg.steps:
        # batch: this step's slice of the epoch permutation; this rank's share of its rows
        batch = batch_for_step(examples, run.step, cfg.batch_size, ctx.recipe.seed)
        rows = [batch[i] for i in world.shard(len(batch))]
        ids, mask, positions = (t.to(device) for t in model_rows(rows, pad, cfg.packing, cfg.pack_length))
        num_tokens = int(world.all_sum(float(mask[:, 1:].sum())))  # global: N ranks equal one process

        # update: global-token-normalized NLL, accumulated over micro-batches (of packed rows when packing)
        def micro_loss(part: slice) -> torch.Tensor:
            with world.autocast():  # no KV cache: HF skips the packed-sequence mask when it is given one
                logits = run.model(input_ids=ids[part], position_ids=positions[part], use_cache=False).logits[:, :-1]
            return sft_loss(logprobs(logits, ids[part, 1:]), mask[part, 1:], num_tokens)

        loss = backward_micro_batches(len(ids), cfg.micro_batch_size, micro_loss, run)
        lr = cfg.lr * warmup_cosine(run.step, cfg.steps, cfg.warmup_steps, cfg.min_lr_ratio)
        grad_norm = clip_and_step(run.model, run.optimizer, lr, cfg.grad_clip, loss)
        run.step += 1
        tokens = world.all_sum(float(sum(len(row) for row, _ in rows)))  # the rows' own tokens, not padding
        tokens_seen += int(tokens)

        # log
        run.record_step({"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_trained": tokens})
    seconds = time.time() - started
    metrics = {
        "final_loss": round(loss, 4),
        "steps": cfg.steps,
        "examples": len(examples),
        "tokens_per_s": round(tokens_seen / max(seconds, 1e-9)),
        "seconds": round(seconds, 1),
    }
    return run.finish(metrics)


def check_world(cfg: SFTConfig, world: World) -> None:
    """Refuse, before the data is read, what this world cannot run: a batch smaller than its ranks, flex attention
    off cuda, compiled layers under torchrun."""
    if cfg.batch_size < world.size:
        raise RecipeError(f"stage {cfg.name!r}: batch_size {cfg.batch_size} cannot be shared by {world.size} ranks")
    check_forward_options(cfg, world)


def load_examples(ctx: StageContext, data: CheckpointRef, tokenizer) -> list[Example]:
    """Token ids and trained spans of every row (a single-turn row or a conversation), read from the Parquet
    shards one record batch at a time."""
    local = materialize(ctx.store, data, ctx.workdir / f"data-{data.digest[:12]}")
    return [conversation_example(tokenizer, messages) for messages in iter_conversations(shard_paths(local / DATA_DIR))]


def pad_batch(batch: list[Example], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and a loss mask [B, T] (1 where the token is an assistant token)."""
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width))
    for row, (tokens, trained) in enumerate(batch):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        for start, end in trained:
            mask[row, start:end] = 1.0
    return ids, mask


def model_rows(
    batch: list[Example], pad: int, packing: bool, pack_length: int | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the model reads for a step's rows: ids, loss mask and position ids, all [R, T]; packed (R <= B
    rows) or padded (R = B, positions 0..T-1 on every row)."""
    if packing:
        return pack_batch(batch, pad, pack_length)
    ids, mask = pad_batch(batch, pad)
    return ids, mask, torch.arange(ids.shape[1]).expand_as(ids)
