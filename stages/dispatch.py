"""Which stage function runs a stage kind, and with which inputs."""

from __future__ import annotations

from artifacts.checkpoint import CheckpointRef, committed
from stages.context import StageContext, StageResult
from stages.difficulty import run_difficulty
from stages.grpo import run_grpo
from stages.mopd import run_mopd
from stages.recipe import DifficultyConfig, StageConfig, reference_kind
from stages.sft import run_sft
from stages.sft_data import run_sft_data


def stage_key(run_id: str, index: int, name: str) -> str:
    return f"runs/{run_id}/{index:02d}-{name}"


def run_stage(
    cfg: StageConfig, ctx: StageContext, model: CheckpointRef | None, data: dict[str, CheckpointRef],
    teachers: dict[str, CheckpointRef],
) -> StageResult:
    """teachers: domain -> checkpoint, for MOPD stages."""
    if cfg.kind == "sft_data":
        return run_sft_data(cfg, ctx)
    if cfg.kind == "sft":
        return run_sft(cfg, ctx, model, data[cfg.data])
    if cfg.kind == "mopd":
        return run_mopd(cfg, ctx, model, teachers)
    if cfg.kind == "difficulty":
        return run_difficulty(cfg, ctx, reference_checkpoint(cfg, ctx))
    return run_grpo(cfg, ctx, model, data[cfg.prompts] if cfg.prompts else None)


def reference_checkpoint(cfg: DifficultyConfig, ctx: StageContext) -> CheckpointRef | None:
    """The committed checkpoint of the run's stage that cfg.reference names (None: the reference is no stage)."""
    if reference_kind(cfg.reference) != "stage":
        return None
    index = [s.name for s in ctx.recipe.stages].index(cfg.reference)
    ref = committed(ctx.store, stage_key(ctx.run_id, index, cfg.reference))
    if ref is None:
        raise ValueError(f"stage {cfg.name!r}: reference stage {cfg.reference!r} has no committed checkpoint "
                         f"in run {ctx.run_id!r}")
    return ref
