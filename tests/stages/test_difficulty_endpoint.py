"""The difficulty filter against an OpenAI-compatible endpoint: a vLLM server this test starts on the tiny model."""

import pytest

from cascade.stages.engines.vllm import VLLMEngine
from cascade.stages.model import build_tiny_model, save_hf
from cascade.stages.config import ModelConfig
from cascade.stages.tokenizer import load_tokenizer
from tests.stages.test_difficulty import even_domain, run_filter  # noqa: F401  (even_domain: a fixture)
from tests.stages.test_vllm_engine import TINY, require_vllm_venv

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture
def server(tmp_path):
    require_vllm_venv()
    tok = load_tokenizer()
    save_hf(build_tiny_model(ModelConfig(**TINY), len(tok), seed=0), tok, tmp_path / "served")
    engine = VLLMEngine(tmp_path / "served")  # its own short workdir: zmq socket paths are capped at 107 chars
    yield engine
    engine.close()


@pytest.mark.usefixtures("even_domain")
def test_endpoint_reference_samples_once_then_serves_from_cache(tmp_path, server, monkeypatch):
    first, rates, _ = run_filter(tmp_path, server.url, "a", reference_tokenizer=str(tmp_path / "served"))
    assert first["prompts"] == 24 and first["rollouts"] == 24 * 8 and first["cache_hits"] == 0
    assert {r["solved"] for r in rates} != {0}  # graded texts from the server, not empty replies

    monkeypatch.setattr(VLLMEngine, "_complete", lambda *a, **k: pytest.fail("a cached prompt was sampled again"))
    again, rates_again, _ = run_filter(tmp_path, server.url, "b", reference_tokenizer=str(tmp_path / "served"))
    assert again["rollouts"] == 0 and again["cache_hits"] == 24 and rates_again == rates
