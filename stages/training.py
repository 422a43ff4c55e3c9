"""Parts every training stage shares: optimizer, LR schedule, micro-batched backward, step checkpoints."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, Callable

import torch

from artifacts.checkpoint import CheckpointRef, prune_step_checkpoints
from artifacts.layout import step_key
from stages.config import TrainingConfig
from stages.context import (
    StageContext,
    latest_step_checkpoint,
    load_policy,
    load_step_state,
    rng_state,
    save_model_checkpoint,
    set_rng_state,
)


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    # fused: one kernel for all parameters; the per-tensor loop cost a third of a tiny-model step on CPU
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, fused=True)


def warmup_cosine(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine down to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lr: float, grad_clip: float) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def backward_micro_batches(n: int, size: int, loss_of: Callable[[slice], torch.Tensor]) -> float:
    """Backward each micro-batch's loss (already normalized by the global count); return the summed loss."""
    total = 0.0
    for part in micro_batches(n, size):
        loss = loss_of(part)
        loss.backward()
        total += float(loss.detach())
    return total


class TrainRun:
    """A stage's model + optimizer, started fresh or restored from its newest step checkpoint."""

    def __init__(self, ctx: StageContext, cfg: TrainingConfig, start: CheckpointRef | None):
        self.ctx, self.cfg, self.start = ctx, cfg, start
        lr, weight_decay = cfg.lr, cfg.weight_decay
        resume = latest_step_checkpoint(ctx, cfg)
        if resume is None:
            self.model, self.tokenizer = load_policy(ctx, start)
            self.optimizer = make_optimizer(self.model, lr, weight_decay)
            self.step, self.history = 0, []
            torch.manual_seed(ctx.recipe.seed)
        else:
            self.model, self.tokenizer, state = load_step_state(ctx, resume)
            self.optimizer = make_optimizer(self.model, lr, weight_decay)
            self.optimizer.load_state_dict(state["optimizer"])
            self.step, self.history = state["step"], state["history"]
            set_rng_state(state["rng"])
            restore = getattr(ctx.log, "restore", None)  # a step log in the store: the history is its truth
            if restore is not None:
                restore(self.step, self.history)
        self.resumed_from = resume
        self.model.train()

    def record_step(self, metrics: dict[str, float]) -> None:
        """After step self.step (count of completed steps): log, show progress, maybe commit a step checkpoint."""
        self.history.append(metrics)
        self.ctx.log.log(self.step, metrics)
        self.ctx.progress(self.step, self.cfg.steps)
        every = self.cfg.checkpoint_every
        if every <= 0 or self.step % every or self.step >= self.cfg.steps:
            return
        state = {"step": self.step, "optimizer": self.optimizer.state_dict(), "rng": rng_state(),
                 "history": self.history}
        save_model_checkpoint(
            self.ctx, step_key(self.ctx.key, self.step), self.model, self.tokenizer,
            cfg=self.cfg, step=self.step, parent=self.start, metrics={}, state=state,
        )
        prune_step_checkpoints(self.ctx.store, self.ctx.key, self.cfg.keep_step_checkpoints)

    def finish(self, metrics: dict[str, Any]) -> CheckpointRef:
        return save_model_checkpoint(
            self.ctx, self.ctx.key, self.model, self.tokenizer,
            cfg=self.cfg, step=self.step, parent=self.start, metrics=metrics,
        )
