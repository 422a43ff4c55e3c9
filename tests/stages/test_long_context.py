"""Long context from the recipe: the longctx haystack's size, the model's window and RoPE scaling (YaRN)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from cascade.stages.domains import get_domain
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.train.model import build_tiny_model, initial_model, save_hf
from cascade.stages.train.tokenizer import load_tokenizer

TINY = {"source": "tiny", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def recipe(options=None, **model):
    return validate_recipe(
        {
            "model": {**TINY, **model},
            "domains": {
                "longctx": {
                    "train_size": 10,
                    "heldout_size": 4,
                    "max_new_tokens": 8,
                    **({"options": options} if options else {}),
                }
            },
            "stages": [{"kind": "grpo", "name": "lc_rl", "domains": ["longctx"], "steps": 1}],
        }
    )


def test_haystack_options_make_prompts_several_times_longer():
    tok = load_tokenizer()
    short = recipe().domain("longctx").generate("train", 20, 0)
    long = recipe({"num_keys": 12, "num_filler": 60}).domain("longctx").generate("train", 20, 0)
    mean = lambda items: sum(len(tok.encode(it.prompt)) for it in items) / len(items)  # noqa: E731
    assert mean(long) > 5 * mean(short)
    assert all(it.prompt.count("The key for") == 12 for it in long)
    lc = get_domain("longctx")  # any instance grades any instance's items: grading reads the item alone
    assert lc.grade_batch(long, [it.reference for it in long]) == [1.0] * 20


def test_yarn_stretches_the_tiny_window_and_survives_a_checkpoint(tmp_path):
    cfg = recipe(max_position_embeddings=4096, rope_scaling=YARN).model
    tok = load_tokenizer()
    model = build_tiny_model(cfg, len(tok), 0)
    assert model.config.max_position_embeddings == 4096
    assert model.config.rope_scaling["rope_type"] == "yarn" and model.config.rope_scaling["factor"] == 4.0
    ids = torch.randint(5, 200, (1, 3000))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 3000, len(tok)) and torch.isfinite(logits).all()
    plain = build_tiny_model(recipe().model, len(tok), 0)  # same weights (same seed), plain RoPE
    with torch.no_grad():
        assert not torch.allclose(plain(input_ids=ids[:, :1000]).logits, model(input_ids=ids[:, :1000]).logits)
    save_hf(model, tok, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.rope_scaling["rope_type"] == "yarn" and loaded.config.max_position_embeddings == 4096
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, logits)


def test_a_loaded_model_takes_the_recipes_window(tmp_path):
    tok = load_tokenizer()
    save_hf(build_tiny_model(recipe().model, len(tok), 0), tok, tmp_path)
    model, _ = initial_model(
        recipe(max_position_embeddings=2048, rope_scaling=YARN).model.model_copy(update={"source": str(tmp_path)}), 0
    )
    assert model.config.max_position_embeddings == 2048 and model.config.rope_scaling["rope_type"] == "yarn"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"options": {"num_keys": 99}}, "num_keys must be in 1..32"),
        ({"options": {"haystack": 3}}, "domains.longctx.options: "),
        ({"rope_scaling": {"rope_type": "magic", "factor": 2.0}}, "rope_type"),
    ],
)
def test_bad_long_context_settings_are_refused(change, message):
    options = change.pop("options", None)
    with pytest.raises(RecipeError, match=message):
        recipe(options, **change)
