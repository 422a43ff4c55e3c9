"""Where an answer ends is one fact: the chat template's end-of-turn token (Qwen's <|im_end|>, Llama 3's
<|eot_id|>), the tokenizer's eos and the generation config's eos ids all stop sampling, in the HF engine and the
vLLM engine alike, and SFT's targets end with the template's token. Before, only the tokenizer's eos stopped a
rollout, so a model whose template ends turns with another token sampled until max_new_tokens."""

import torch

from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.model import build_tiny_model, completion_ids, end_of_turn_ids, prompt_ids, turn_end_id
from cascade.stages.train.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def tokenizer_whose_eos_is_not_the_turn_end():
    """The tiny tokenizer's ChatML template ends turns with <|im_end|> (id 2); its eos becomes <|endoftext|> (id 0),
    as in base checkpoints whose eos is the document end."""
    tok = load_tokenizer()
    tok.eos_token = "<|endoftext|>"
    return tok


def test_the_turn_end_is_read_from_the_template_and_every_end_id_is_collected():
    tok = tokenizer_whose_eos_is_not_the_turn_end()
    assert (tok.eos_token_id, turn_end_id(tok)) == (0, 2)
    assert completion_ids(tok, "4")[-1] == 2  # SFT teaches the template's end of turn
    config = type("GenerationConfig", (), {"eos_token_id": [2, 5]})()
    assert end_of_turn_ids(tok, config) == [2, 0, 5]  # the template's first; no duplicates
    assert end_of_turn_ids(load_tokenizer()) == [2]


def test_the_hf_engine_stops_at_the_templates_turn_end_though_the_eos_differs():
    tok = tokenizer_whose_eos_is_not_the_turn_end()
    model = build_tiny_model(SMALL, len(tok), seed=1)
    model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_add(  # <|im_end|> likely
            -1, torch.tensor([2]), torch.full((*logits.shape[:-1], 1), 4.0)
        )
    )
    group = HFEngine(model, tok, batch_size=16).generate(
        [prompt_ids(tok, "Compute 2+2.")], 16, SamplingParams(max_new_tokens=24, seed=0)
    )[0]
    stopped = [c for c in group if c.finish_reason == "stop"]
    assert len(stopped) >= 12  # with only eos (id 0) as a stop, every row ran to 24 tokens
    for c in stopped:
        assert c.token_ids[-1] == 2 and 2 not in c.token_ids[:-1] and len(c.token_ids) < 24
