"""`engine.kind: vllm` end to end: a GRPO stage of the micro cascade samples from a managed vLLM server."""

import pytest

from cascade.flows.cascade import cascade_flow
from tests.conftest import micro_recipe
from tests.stages.test_vllm_engine import require_vllm_venv

pytestmark = [pytest.mark.long, pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("prefect_harness")]


@pytest.fixture(autouse=True)
def vllm_venv():
    require_vllm_venv()


def test_micro_cascade_with_vllm_rollouts(tmp_path):
    """Through the flow up to one GRPO stage: each engine stage starts a server of its own (30-60 s on 2 busy cores),
    and the difficulty stage and a second GRPO stage would add two more without reaching other code here
    (test_vllm_engine tests the engine and its weight sync, test_ray_launcher one server for two ranks)."""
    recipe = micro_recipe(tmp_path, "engine.kind=vllm", "eval.enabled=false")
    recipe = recipe.model_copy(update={"stages": [s for s in recipe.stages if s.name not in ("difficulty", "if_rl")]})
    report = cascade_flow(recipe, "vllm")
    grpo = [s for s in report.stages if s.kind == "grpo"]
    assert [s.name for s in grpo] == ["math_rl"]
    for stage in grpo:
        assert stage.status == "completed"
        assert stage.metrics["engine"] == "vllm"
        # pi_train (fp32 forward) vs pi_inf (vLLM fp32): small but reported for every stage
        assert stage.metrics["logprob_mismatch"] is not None
        assert 0 <= stage.metrics["logprob_mismatch"] < 0.05
