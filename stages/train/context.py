"""What every stage receives, and the checkpoint plumbing stages share.

A stage is a plain function `run_<kind>(cfg, ctx, inputs) -> StageResult` (stages/kinds/registry.py); it runs under
Prefect or in a test. `ctx.log` is any MetricSink (MLflow in the flow, a list in tests).
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerFast

from cascade.artifacts.checkpoint import CheckpointError, CheckpointRef, committed, materialize, write_checkpoint
from cascade.artifacts.config import config_hash
from cascade.artifacts.layout import step_key, steps_dir
from cascade.artifacts.scratch import owned_tempdir
from cascade.artifacts.store import Store
from cascade.stages.recipe.schema import Recipe
from cascade.stages.train.model import initial_model, load_hf, save_hf

log = logging.getLogger("cascade.checkpoint")
TRAIN_STATE_DIR = "train"  # state/train/: a step checkpoint's model + optimizer state, DCP-sharded by rank
# an HF model directory -> (model, tokenizer): a causal LM (load_hf) or another head on one (a reward model)
ModelLoad = Callable[[Path], tuple[torch.nn.Module, PreTrainedTokenizerFast]]


class MetricSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        """A resume from the step checkpoint at `step`, whose `history` (one entry per step up to it) is the truth
        of what was logged: a sink that keeps a history (the run's step log) replaces its own with it; one that
        keeps none does nothing (this default)."""


@dataclass
class ListSink(MetricSink):
    rows: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append((step, dict(metrics)))

    def series(self, name: str) -> list[float]:
        return [m[name] for _, m in self.rows if name in m]


class TeeSink(MetricSink):
    """Every step's metrics to each sink (MLflow or a list, and the run's step log); a resume's restored history
    to each, for those that keep one."""

    def __init__(self, *sinks: MetricSink):
        self.sinks = sinks

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.log(step, metrics)

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        for sink in self.sinks:
            sink.restore(step, history)


def _no_progress(done: int, total: int) -> None:
    pass


@dataclass
class StageContext:
    recipe: Recipe
    store: Store
    run_id: str
    key: str  # runs/<run_id>/<NN>-<stage>: where this stage's checkpoint goes
    log: MetricSink
    progress: Callable[[int, int], None] = _no_progress
    workdir: Path = field(kw_only=True)  # scratch space for this stage only (see stage_workdir)


@contextlib.contextmanager
def stage_workdir() -> Iterator[Path]:
    """A stage's scratch directory (downloaded checkpoints, copies staged for a commit), removed when the stage
    ends, failed or not. A resume reads the store, never this directory; a model copy left behind per stage fills
    a disk within a few runs. This process owns it while the stage runs: one that a kill -9 left behind is
    `cascade gc --local`'s to remove."""
    with owned_tempdir() as path:
        yield path


@dataclass
class StageResult:
    checkpoint: CheckpointRef
    metrics: dict[str, Any]
    plots: dict[str, str] = field(default_factory=dict)  # name -> image path inside the checkpoint (run report, MLflow)


def load_policy(ctx: StageContext, ref: CheckpointRef | None) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """The start model: the given checkpoint, or the recipe's initial model when no stage wrote one yet."""
    return load_checkpoint(ctx.recipe, ctx.store, ref, ctx.workdir)


def load_checkpoint(
    recipe: Recipe, store: Store, ref: CheckpointRef | None, workdir: Path
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A checkpoint of `store` (downloaded and verified into workdir), or the recipe's model source for None."""
    if ref is None:
        return initial_model(recipe.model, recipe.seed)
    local = materialize(store, ref, Path(tempfile.mkdtemp(dir=workdir)))
    return load_hf(local / "model" if (local / "model").exists() else local)


def save_model_checkpoint(
    ctx: StageContext,
    key: str,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    *,
    cfg: Any,
    step: int | None,
    parent: CheckpointRef | None,
    metrics: dict[str, Any],
    state: dict[str, Any] | None = None,
    local: Path | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> CheckpointRef:
    """model/ (HF format) and, for step checkpoints, state/trainer.pt; the manifest goes last.

    local: a directory already holding more of the checkpoint (the DCP train state); weights: the model's
    full state dict when the module holds only a shard of it (FSDP2). The staged directory is removed once the
    store holds the checkpoint."""
    local = local or Path(tempfile.mkdtemp(dir=ctx.workdir))
    try:
        save_hf(model, tokenizer, local / "model", weights)
        if state is not None:
            (local / "state").mkdir(exist_ok=True)
            torch.save(state, local / "state" / "trainer.pt")
        return write_checkpoint(
            ctx.store,
            key,
            local,
            stage=cfg.name,
            step=step,
            parent=parent,
            config_hash=config_hash(cfg),
            metrics=metrics,
        )
    finally:  # the staged copy: a long stage would otherwise keep one per step checkpoint until it ends
        shutil.rmtree(local, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def latest_step_checkpoint(ctx: StageContext, cfg: Any) -> CheckpointRef | None:
    """The newest step checkpoint of this stage, written under the same config, that verifies.

    Committed (manifest + sizes) is not enough: each candidate is downloaded and sha256-checked (into a cache
    dir that load_step_state reuses, so this costs no second download). One that fails is skipped with a warning
    naming the bad file, and the previous step is tried: resume loses a few steps instead of the run."""
    steps = sorted((int(s) for s in ctx.store.list_dirs(steps_dir(ctx.key)) if s.isdigit()), reverse=True)
    for step in steps:
        ref = committed(ctx.store, step_key(ctx.key, step))
        if ref is None or ref.config_hash != config_hash(cfg):
            continue
        try:
            _verified_copy(ctx, ref)
        except CheckpointError as e:
            log.warning("step checkpoint %s is not usable (%s); falling back to the previous step", ref.uri, e)
            continue
        return ref
    return None


def _verified_copy(ctx: StageContext, ref: CheckpointRef) -> Path:
    """A local, sha256-verified copy of ref under ctx.workdir, downloaded once per digest."""
    local = ctx.workdir / "verified" / ref.digest[:32]
    if not (local / ".verified").exists():
        shutil.rmtree(local, ignore_errors=True)  # a copy cut off mid-download
        materialize(ctx.store, ref, local)
        (local / ".verified").touch()
    return local


def load_step_state(
    ctx: StageContext, ref: CheckpointRef, load: ModelLoad = load_hf
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast, dict[str, Any], Path]:
    """The step's HF model (read by `load`), tokenizer, trainer state (step, RNG, history), and the local copy (its
    DCP state)."""
    local = _verified_copy(ctx, ref)
    model, tok = load(local / "model")
    return model, tok, torch.load(local / "state" / "trainer.pt", weights_only=False), local
