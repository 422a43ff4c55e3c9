"""A byte flipped in a committed step checkpoint: loading names the file, and resume falls back to the previous
valid step with a warning naming it, then reaches the same weights as a run that was never corrupted."""

import logging

import pytest
import torch

import cascade.stages.train.context
from cascade.artifacts.checkpoint import CheckpointError, committed, materialize
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft.run_sft import run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.train.context import latest_step_checkpoint
from tests.faults.conftest import Preempted, new_bucket, preempt_at, s3_recipe, stage_ctx, stage_weights

pytestmark = pytest.mark.slow


def flip_byte(store, key: str, offset: int = 4096) -> None:
    data = bytearray(store.read_bytes(key))
    data[min(offset, len(data) - 1)] ^= 0x01
    store.write_bytes(key, bytes(data))


def test_corrupted_step_is_detected_and_resume_falls_back(s3, tmp_path, monkeypatch, caplog):
    recipe = s3_recipe(tmp_path, s3.url, new_bucket(s3.url))
    cfg = recipe.stage("sft")
    data = run_sft_data(
        recipe.stage("sft_data"), stage_ctx(recipe, tmp_path / "a", "sft_data"), StageInputs()
    ).checkpoint
    straight = stage_ctx(recipe, tmp_path / "a", "sft", run_id="straight")
    run_sft(cfg, straight, StageInputs(stages={"sft_data": data}))

    ctx = stage_ctx(recipe, tmp_path / "b", "sft")
    preempt_at(monkeypatch, cascade.stages.train.context, "write_checkpoint", 5)  # steps 1-4 committed
    with pytest.raises(Preempted):
        run_sft(cfg, ctx, StageInputs(stages={"sft_data": data}))
    monkeypatch.undo()
    bad = f"{ctx.key}/steps/4/model/model.safetensors"
    flip_byte(ctx.store, bad)
    ref = committed(ctx.store, f"{ctx.key}/steps/4")
    assert ref is not None  # same size: the manifest still "commits" it; only sha256 can tell
    with pytest.raises(CheckpointError, match=r"steps/4: model/model.safetensors does not match its sha256"):
        materialize(ctx.store, ref, tmp_path / "out")

    fresh = stage_ctx(recipe, tmp_path / "c", "sft")  # a new process's view: nothing cached locally
    with caplog.at_level(logging.WARNING, logger="cascade.checkpoint"):
        assert latest_step_checkpoint(fresh, cfg).step == 3
    assert "steps/4 is not usable" in caplog.text and "model/model.safetensors does not match" in caplog.text
    assert "falling back to the previous step" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cascade.checkpoint"):
        run_sft(cfg, fresh, StageInputs(stages={"sft_data": data}))  # resumes from step 3, redoes 4-6
    assert "model/model.safetensors does not match" in caplog.text
    resumed, reference = stage_weights(fresh), stage_weights(straight)
    for name, tensor in reference.items():
        assert torch.allclose(resumed[name], tensor, atol=1e-6), name


def test_every_step_corrupted_means_a_fresh_start_not_a_bad_load(s3, tmp_path, monkeypatch, caplog):
    recipe = s3_recipe(tmp_path, s3.url, new_bucket(s3.url))
    cfg = recipe.stage("sft")
    data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
    ctx = stage_ctx(recipe, tmp_path, "sft")
    preempt_at(monkeypatch, cascade.stages.train.context, "write_checkpoint", 3)
    with pytest.raises(Preempted):
        run_sft(cfg, ctx, StageInputs(stages={"sft_data": data}))
    monkeypatch.undo()
    for step in (1, 2):
        flip_byte(ctx.store, f"{ctx.key}/steps/{step}/state/trainer.pt", offset=100)
    with caplog.at_level(logging.WARNING, logger="cascade.checkpoint"):
        assert latest_step_checkpoint(stage_ctx(recipe, tmp_path / "fresh", "sft"), cfg) is None
    assert caplog.text.count("state/trainer.pt does not match") == 2
