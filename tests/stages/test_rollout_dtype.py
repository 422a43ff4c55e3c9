"""engine.rollout_dtype: compute samples an on-policy stage's rollouts from a copy of the policy in the training
dtype (bf16), refreshed after every update; fp32 (the default) samples from the trained module itself."""

import pytest
import torch

from cascade.stages.engines.hf import HFEngine
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.recipe.sections import EngineConfig
from cascade.stages.train.context import ListSink
from cascade.stages.train.lora import MergedCopy
from tests.stages.test_training import stage_ctx, vowel_recipe

HEAD = "model.layers.0.mlp.down_proj.weight"


def sampled_with(monkeypatch, tmp_path, dtype: str, rollout_dtype: str):
    """Run 3 GRPO steps on the vowel task; return the sink, each generate call's (parameter dtype, module is the
    trainer's), and each refresh's check that the copy holds the trainer's weights cast to the copy's dtype."""
    recipe = vowel_recipe(tmp_path, monkeypatch, steps=3)
    recipe = recipe.model_copy(
        update={
            "compute": recipe.compute.model_copy(update={"dtype": dtype}),
            "engine": EngineConfig(rollout_dtype=rollout_dtype),
        }
    )
    calls, refreshes = [], []
    generate, refresh = HFEngine.generate, MergedCopy.refresh

    def spy_generate(self, *args, **kwargs):
        calls.append((next(self.model.parameters()).dtype, self.model.training))
        return generate(self, *args, **kwargs)

    def spy_refresh(self):
        module = refresh(self)
        trained = dict(self.source.named_parameters())[HEAD].detach()
        copied = dict(module.named_parameters())[HEAD]
        refreshes.append(torch.equal(copied, trained.to(copied.dtype)) and not torch.equal(copied.float(), trained))
        return module

    monkeypatch.setattr(HFEngine, "generate", spy_generate)
    monkeypatch.setattr(MergedCopy, "refresh", spy_refresh)
    sink = ListSink()
    run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    return sink, calls, refreshes


def test_compute_rollouts_sample_a_bf16_copy_refreshed_after_each_update(tmp_path, monkeypatch):
    sink, calls, refreshes = sampled_with(monkeypatch, tmp_path, "bf16", "compute")
    assert calls == [(torch.bfloat16, False)] * 3  # a plain copy in eval mode, never the trained module
    assert refreshes == [True] * 3  # after each update: the next step samples its weights, cast
    # the bf16 sampler's logprobs differ from the trainer's autocast forward, and tis (auto in bf16) weighs them
    assert min(sink.series("logprob_mismatch")) > 1e-4
    assert len(sink.series("is_corrected")) == 3


def test_fp32_rollouts_sample_the_trained_module_itself(tmp_path, monkeypatch):
    sink, calls, refreshes = sampled_with(monkeypatch, tmp_path, "bf16", "fp32")
    assert calls == [(torch.float32, True)] * 3 and refreshes == []


def test_compute_rollouts_of_an_fp32_stage_need_no_copy(tmp_path, monkeypatch):
    sink, calls, refreshes = sampled_with(monkeypatch, tmp_path, "fp32", "compute")
    assert calls == [(torch.float32, True)] * 3 and refreshes == []
    assert max(sink.series("logprob_mismatch")) < 1e-3


def test_rollout_dtype_is_refused_for_a_vllm_engine():
    with pytest.raises(ValueError, match="engine.rollout_dtype is the HF engine's"):
        EngineConfig(kind="vllm", rollout_dtype="compute")
