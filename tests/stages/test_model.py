"""The tiny model and its tokenizer are ordinary HF artifacts that round-trip."""

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.model import build_tiny_model, completion_ids, load_hf, num_parameters, prompt_ids, save_hf
from cascade.stages.train.tokenizer import load_tokenizer

SAMPLES = ["Compute 7-3+9.", "7-3=4\n4+9=13\n\\boxed{13}", "- snow\n- ICE", "def f(x):\n    return x * 2", "héllo ✓"]


def test_tokenizer_round_trips_and_splits_digits():
    tok = load_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    digits = tok.encode("2026", add_special_tokens=False)
    assert [tok.decode([i]) for i in digits] == ["2", "0", "2", "6"]


def test_chat_template_and_completion_boundary():
    tok = load_tokenizer()
    ids = prompt_ids(tok, "Compute 1+2.")
    assert tok.decode(ids) == "<|im_start|>user\nCompute 1+2.<|im_end|>\n<|im_start|>assistant\n"
    answer = completion_ids(tok, "1+2=3\n\\boxed{3}")
    assert answer[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    # prompt + completion tokenized apart equals the whole conversation tokenized at once
    whole = tok.apply_chat_template(
        [{"role": "user", "content": "Compute 1+2."}, {"role": "assistant", "content": "1+2=3\n\\boxed{3}"}],
        tokenize=False,
    )
    assert tok.encode(whole, add_special_tokens=False)[: len(ids) + len(answer)] == ids + answer


def test_tiny_model_saves_and_loads_as_hf_checkpoint(tmp_path):
    tok = load_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), seed=0)
    assert 2_000_000 < num_parameters(model) < 10_000_000
    save_hf(model, tok, tmp_path)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "tokenizer.json").exists()
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    loaded, loaded_tok = load_hf(tmp_path)
    x = torch.tensor([prompt_ids(tok, "Compute 1+2.")])
    with torch.no_grad():
        assert torch.equal(model(x).logits, again(x).logits)
        assert torch.equal(model(x).logits, loaded(x).logits)
    assert loaded_tok.encode(SAMPLES[1]) == tok.encode(SAMPLES[1])


def test_a_checkpoint_source_loads_and_leaves_no_copy_behind(tmp_path, monkeypatch):
    """A committed checkpoint as a model source is downloaded, loaded and its copy removed; checking the source
    reads only the manifest. A copy left per load (evals, plans, teachers) filled CI's disk once."""
    from cascade.artifacts.checkpoint import write_checkpoint
    from cascade.artifacts.store import Store
    from cascade.stages.train.model import initial_model
    from cascade.stages.train.model_source import check_model_source

    tok = load_tokenizer()
    model = build_tiny_model(ModelConfig(), len(tok), seed=0)
    save_hf(model, tok, tmp_path / "staged" / "model")
    uri = f"file://{tmp_path / 'store'}/runs/r/01-sft"
    write_checkpoint(Store(uri), "", tmp_path / "staged", stage="sft", step=None, parent=None, config_hash="0")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    check_model_source(uri)
    assert list(scratch.iterdir()) == []
    loaded, _ = load_hf(uri)
    started, _ = initial_model(ModelConfig(source=uri), seed=1)
    assert list(scratch.iterdir()) == []
    x = torch.tensor([prompt_ids(tok, "Compute 1+2.")])
    with torch.no_grad():
        assert torch.equal(model(x).logits, loaded(x).logits)
        assert torch.equal(model(x).logits, started(x).logits)


def test_same_seed_same_weights():
    tok = load_tokenizer()
    a = build_tiny_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64), len(tok), 3)
    b = build_tiny_model(ModelConfig(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=64), len(tok), 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
