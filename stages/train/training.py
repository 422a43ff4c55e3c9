"""Parts every training stage shares: optimizer, LR schedule, micro-batched backward, step checkpoints.

`TrainRun` runs in one process or as one rank of N under torchrun (stages/scale/distributed.py): the model is on the
compute device (FSDP2-sharded under torchrun), step checkpoints hold the sharded train state (DCP) beside an
ordinary HF model directory, and only rank 0 writes to the store, after every rank's shard is on disk.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.distributed.tensor import DTensor

from cascade.artifacts.checkpoint import CheckpointRef, prune_step_checkpoints
from cascade.artifacts.layout import step_key
from cascade.stages.errors import NonFiniteSteps
from cascade.stages.recipe.config_base import SMOLLM2, OptimizerConfig, TrainingConfig
from cascade.stages.scale.distributed import (
    World,
    full_state_dict,
    load_train_state,
    prepare_model,
    rank_micro_batches,
    save_train_state,
    world_for,
)
from cascade.stages.train.context import (
    TRAIN_STATE_DIR,
    ModelLoad,
    StageContext,
    StageResult,
    latest_step_checkpoint,
    load_policy,
    load_step_state,
    rng_state,
    save_model_checkpoint,
    set_rng_state,
)
from cascade.stages.train.lora import (
    ADAPTER_DIR,
    BASE_MODEL_DIR,
    MergedCopy,
    add_lora,
    merged_state_dict,
    save_adapter,
)
from cascade.stages.train.model import initial_model, load_hf, save_hf
from cascade.stages.train.model_source import smollm2_dir
from cascade.stages.train.precision import sampling_dtype

Row = TypeVar("Row")


def make_optimizer(model: torch.nn.Module, lr: float, cfg: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the trainable tensors (with LoRA: the adapters), with cfg's betas, its weight decay on the
    matrices (ndim >= 2) and none on norm gains and biases."""
    trained = [p for p in model.parameters() if p.requires_grad]
    matrices = [p for p in trained if p.ndim >= 2]
    vectors = [p for p in trained if p.ndim < 2]
    groups = [{"params": matrices, "weight_decay": cfg.weight_decay}, {"params": vectors, "weight_decay": 0.0}]
    # fused: one kernel for all parameters; the per-tensor loop cost a third of a tiny-model step on CPU
    return torch.optim.AdamW(groups, lr=lr, betas=cfg.adam_betas, fused=True)


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine down to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_constant(step: int, warmup: int) -> float:
    """LR multiplier: linear warm-up to 1 over `warmup` steps (step is 0-based), then 1."""
    return min(1.0, (step + 1) / warmup) if warmup else 1.0


# A step whose loss or gradient norm is not finite is skipped; this many in a row fail the stage.
MAX_NONFINITE_IN_ROW = 3


def clip_and_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr: float, grad_clip: float, loss: float
) -> float:
    """Clip the gradient to norm grad_clip and take the optimizer step; return the norm before clipping.

    A step whose loss or gradient norm is inf or NaN changes nothing: the gradient is dropped and neither the
    weights nor the optimizer's moments move (AdamW would write NaN into both for good). The norm is then NaN
    and the caller counts the skip. Under FSDP2 the norm is reduced over every rank and the loss is the global
    sum, so every rank takes the same decision."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    norm = float(grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm)  # FSDP2: sharded
    finite = math.isfinite(norm) and math.isfinite(loss)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm if finite else math.nan


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def backward_micro_batches(
    n: int, size: int, loss_of: Callable[[slice], torch.Tensor], run: TrainRun | None = None
) -> float:
    """Backward each micro-batch's loss (already normalized by the global count); return the summed loss. With
    a run, over every rank: ranks run the same number of micro-batches, a short rank idle ones."""
    if run is None:
        parts = micro_batches(n, size)
    else:
        parts = rank_micro_batches(run.world, n, size)
    total = 0.0
    for part in parts:
        loss = loss_of(part) if part.start < part.stop else idle_loss(run.model, run.world)
        loss.backward()
        total += float(loss.detach())
    return total if run is None else run.world.all_sum(total)


def batch_for_step(rows: list[Row], step: int, batch_size: int, seed: int) -> list[Row]:
    """The step's batch of a fixed data set: its slice of the epoch's permutation, a function of (seed, epoch), so
    a resumed stage reads the rows it would have read (SFT's examples, the reward model's pairs)."""
    per_epoch = max(1, len(rows) // batch_size)
    epoch, offset = divmod(step, per_epoch)
    order = list(range(len(rows)))
    random.Random(f"sft:{seed}:{epoch}").shuffle(order)
    return [rows[i] for i in order[offset * batch_size : (offset + 1) * batch_size]]


def idle_loss(model: torch.nn.Module, world: World) -> torch.Tensor:
    """A one-token forward whose loss is 0: a rank without rows still joins FSDP2's collectives (an empty batch
    cannot be forwarded)."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=world.device)
    with world.autocast():
        return model(input_ids=ids).logits.sum() * 0.0


class TrainRun:
    """A stage's model + optimizer, started fresh or restored from its newest step checkpoint.

    The model is a causal LM that starts from `start` (None: the recipe's initial model). A stage that trains
    another model gives `fresh`, which returns its starting model and tokenizer, and `load`, which reads the model
    of one of its step checkpoints (a reward model: a one-label classifier; `start` is then only the parent).
    With `cfg.lora` the model trains through adapters (stages/train/lora.py) and `heads` (modules the stage made fresh,
    such as a reward model's score) train whole beside them."""

    def __init__(
        self,
        ctx: StageContext,
        cfg: TrainingConfig,
        start: CheckpointRef | None,
        fresh: Callable[[], tuple[torch.nn.Module, Any]] | None = None,
        load: ModelLoad = load_hf,
        heads: tuple[str, ...] = (),
    ):
        self.ctx, self.cfg, self.start = ctx, cfg, start
        self.world = world_for(ctx.recipe.compute_for(cfg))
        self._merged: MergedCopy | None = None
        resume = latest_step_checkpoint(ctx, cfg)
        if resume is None:
            model, self.tokenizer = load_policy(ctx, start) if fresh is None else fresh()
            self.model = prepare_model(self._adapted(model, heads), self.world)
            self.optimizer = make_optimizer(self.model, cfg.lr, cfg)
            self.step, self.history = 0, []
            self.carried: dict[str, Any] = {}  # what a stage carries across steps in its step checkpoints
            torch.manual_seed(ctx.recipe.seed)
        else:
            # with LoRA the step's model/ is merged; the train state below restores the unmerged weights exactly
            model, self.tokenizer, state, local = load_step_state(ctx, resume, load)
            self.model = prepare_model(self._adapted(model, heads), self.world)
            self.optimizer = make_optimizer(self.model, cfg.lr, cfg)
            if "optimizer" in state:  # a step checkpoint from before DCP train state: one process's optimizer
                self.optimizer.load_state_dict(state["optimizer"])
            else:
                load_train_state(self.model, self.optimizer, local / "state" / TRAIN_STATE_DIR)
            self.step, self.history = state["step"], state["history"]
            self.carried = state.get("carried", {})
            set_rng_state(state["rng"])
            ctx.log.restore(self.step, self.history)  # a step log in the store: the history is its truth
        self.resumed_from = resume
        self.model.train()
        self._step_started = time.perf_counter()

    def _adapter_base(self, key: str, local: Path) -> str:
        """Where the model the adapter adapts can be loaded from: the parent checkpoint's model/, the recipe's
        model source, or (a model built from its config, which is saved nowhere else) a copy in the checkpoint's
        own base_model/. A file store's location is its path, which `from_pretrained` reads."""
        store = self.ctx.store
        where = store.path if store.protocol == "file" else store.uri
        if self.start is not None:
            return where(f"{self.start.key}/model")
        source = self.ctx.recipe.model.source
        if source == SMOLLM2:  # its converted copy, which loading the stage's start already made
            return str(smollm2_dir())
        if source != "tiny":  # an HF directory or a checkpoint: named as the recipe names it, nothing downloaded
            return source
        base, tokenizer = initial_model(self.ctx.recipe.model, self.ctx.recipe.seed)
        save_hf(base, tokenizer, local / BASE_MODEL_DIR)
        return where(f"{key}/{BASE_MODEL_DIR}")

    def _adapted(self, model: torch.nn.Module, heads: tuple[str, ...]) -> torch.nn.Module:
        return model if self.cfg.lora is None else add_lora(model, self.cfg.lora, self.ctx.recipe.seed, heads)

    def policy_for_sampling(self, separate: bool = False) -> torch.nn.Module:
        """The module an engine samples from, with the current weights: the trained module itself, or a plain copy
        holding its (with LoRA: merged) weights in the sampling dtype, refreshed on each call (after each update).
        `separate`: a copy even without LoRA, for an engine that samples while the trainer steps
        (stages/train/rollout_ahead.py); in a multi-rank stage the engines' replicas and servers are copies
        already, and the module is returned."""
        copied = separate or self.sampling_dtype() is not None
        if self.world.distributed or (self.cfg.lora is None and not copied):
            return self.model
        if self._merged is None:
            self._merged = MergedCopy(self.model, self.sampling_dtype())
            return self._merged.module
        return self._merged.refresh()

    def sampling_dtype(self) -> torch.dtype | None:
        """The dtype the HF engine samples this stage's rollouts in, where it is not the weights' own."""
        return sampling_dtype(self.ctx.recipe.engine, self.world.dtype)

    def record_step(self, metrics: dict[str, float], carried: Callable[[], dict[str, Any]] | None = None) -> None:
        """After step self.step (count of completed steps): log, show progress, maybe commit a step checkpoint,
        which holds what `carried()` returns (plain data a stage restores from `self.carried`, such as a batch drawn
        ahead; called only when a checkpoint is committed).
        Adds the step's wall seconds (from the end of the previous step's record, a step checkpoint's commit
        excluded): the stage reads a device-synced value (loss, grad norm) before it records, so the time holds.
        A step that clip_and_step skipped (its grad_norm NaN) is logged with `skipped: 1`; the last
        MAX_NONFINITE_IN_ROW of them in a row fails the stage (NonFiniteSteps) before any checkpoint of it."""
        skipped = not math.isfinite(metrics.get("grad_norm", 0.0))
        self._check_finite(skipped, metrics.get("loss", math.nan))
        metrics = {**metrics, "skipped": float(skipped), "step_seconds": time.perf_counter() - self._step_started}
        self.history.append(metrics)
        self.ctx.log.log(self.step, metrics)
        self.ctx.progress(self.step, self.cfg.steps)
        every = self.cfg.checkpoint_every
        if every > 0 and self.step % every == 0 and self.step < self.cfg.steps:
            state = {
                "step": self.step,
                "rng": rng_state(),
                "history": self.history,
                "carried": carried() if carried else {},
            }
            self._commit(step_key(self.ctx.key, self.step), {}, state)
            if self.world.is_main:
                prune_step_checkpoints(self.ctx.store, self.ctx.key, self.cfg.keep_step_checkpoints)
        self._step_started = time.perf_counter()

    def _check_finite(self, skipped: bool, loss: float) -> None:
        recent = [*(m.get("skipped", 0.0) for m in self.history[-(MAX_NONFINITE_IN_ROW - 1) :]), float(skipped)]
        if len(recent) < MAX_NONFINITE_IN_ROW or not all(recent):
            return
        cause = (
            "the loss was not finite: a sampled token with probability 0 under the trainer (top_p < 1?) or an "
            "overflow in the forward"
            if not math.isfinite(loss)
            else "the gradient overflowed: lower the learning rate or compute.dtype: fp32"
        )
        raise NonFiniteSteps(
            f"{self.ctx.key}: steps {self.step - MAX_NONFINITE_IN_ROW + 1}-{self.step} were skipped, "
            f"{MAX_NONFINITE_IN_ROW} in a row: {cause}"
        )

    def finish(self, metrics: dict[str, Any]) -> StageResult:
        """The stage's checkpoint (the whole model as one HF directory, gathered to rank 0 under torchrun) and its
        metrics, with the dtype it trained in (compute.dtype auto is decided per host)."""
        # with LoRA the adapters (and trained heads) only; an FSDP2 parameter's numel is the whole tensor's
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        metrics = {**metrics, "dtype": self.world.dtype, "trainable_parameters": trainable}
        return StageResult(self._commit(self.ctx.key, metrics, None), metrics)

    def _commit(self, key: str, metrics: dict[str, Any], state: dict[str, Any] | None) -> CheckpointRef:
        """Every rank writes its share of the train state (step checkpoints) into one local directory; after a
        barrier, rank 0 adds the HF model and the trainer state and commits it, manifest last. Every rank
        returns rank 0's ref."""
        local = Path(self.world.from_main(tempfile.mkdtemp(dir=self.ctx.workdir) if self.world.is_main else None))
        if state is not None:
            save_train_state(self.model, self.optimizer, local / "state" / TRAIN_STATE_DIR)
        weights = full_state_dict(self.model, self.world)  # a collective; None in one process
        if self.cfg.lora is not None and self.world.is_main:  # under torchrun, from the gathered weights
            save_adapter(self.model, local / ADAPTER_DIR, self._adapter_base(key, local), weights)
            weights = merged_state_dict(self.model, weights)
        self.world.barrier()
        ref = None
        if self.world.is_main:
            ref = save_model_checkpoint(
                self.ctx,
                key,
                self.model,
                self.tokenizer,
                cfg=self.cfg,
                step=self.step,
                parent=self.start,
                metrics=metrics,
                state=state,
                local=local,
                weights=weights,
            )
        return self.world.from_main(ref)
