"""Which stage function runs a stage kind, and with which inputs."""

from __future__ import annotations

from artifacts.checkpoint import CheckpointRef
from stages.context import StageContext, StageResult
from stages.grpo import run_grpo
from stages.mopd import run_mopd
from stages.recipe import StageConfig
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
    return run_grpo(cfg, ctx, model)
