"""The HF engine's logprobs are the model's, greedy is deterministic, sampling is seeded."""

import torch

from stages.engines.base import SamplingParams
from stages.engines.hf import HFEngine
from stages.model import build_tiny_model, prompt_ids
from stages.config import ModelConfig
from stages.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def engine(batch_size=8):
    tok = load_tokenizer()
    return HFEngine(build_tiny_model(SMALL, len(tok), seed=1), tok, batch_size=batch_size, seed=0), tok


def full_forward_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_logprobs_match_a_full_forward_with_left_padding():
    eng, tok = engine()
    prompts = [prompt_ids(tok, "Compute 1+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    groups = eng.generate(prompts, 3, SamplingParams(temperature=1.0, max_new_tokens=12, seed=5))
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) > 0
            ref = full_forward_logprobs(eng.model, prompt, c.token_ids)
            assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-4)


def test_greedy_is_deterministic_and_batch_independent():
    eng, tok = engine(batch_size=1)
    eng_big, _ = engine(batch_size=16)
    prompts = [prompt_ids(tok, f"Compute {i}+1.") for i in range(4)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    one = [g[0].token_ids for g in eng.generate(prompts, 1, greedy)]
    many = [g[0].token_ids for g in eng_big.generate(prompts, 1, greedy)]
    assert one == many


def test_seeded_sampling_repeats_and_differs_across_seeds():
    eng, tok = engine()
    p = [prompt_ids(tok, "Compute 5-2.")]
    a = eng.generate(p, 4, SamplingParams(max_new_tokens=8, seed=1))
    b = eng.generate(p, 4, SamplingParams(max_new_tokens=8, seed=1))
    c = eng.generate(p, 4, SamplingParams(max_new_tokens=8, seed=2))
    assert [x.token_ids for x in a[0]] == [x.token_ids for x in b[0]]
    assert [x.token_ids for x in a[0]] != [x.token_ids for x in c[0]]


def test_stops_at_end_of_turn():
    eng, tok = engine()
    eos = tok.eos_token_id
    calls = []

    def favour_eos_from_third_token(module, inputs, logits):
        calls.append(1)
        if len(calls) >= 3:  # call 1 is the prompt prefill; make the 3rd sampled token the end of turn
            logits = logits.clone()
            logits[..., eos] += 1e4
        return logits

    eng.model.lm_head.register_forward_hook(favour_eos_from_third_token)
    out = eng.generate([prompt_ids(tok, "Compute 1+1.")], 2, SamplingParams(temperature=0.0, max_new_tokens=8))
    for c in out[0]:
        assert c.finish_reason == "stop" and len(c.token_ids) == 3 and c.token_ids[-1] == eos
        assert c.text == tok.decode(c.token_ids[:-1])


def test_shared_prefill_matches_repeating_each_prompt():
    """n samples of a prompt prefill it once, yet give the tokens and logprobs of n separate copies of it."""
    eng, tok = engine(batch_size=6)  # 3 prompts x 4 samples: batches split groups across a boundary
    prompts = [prompt_ids(tok, f"Compute {i}+{i}.") for i in range(3)]
    prefill_rows = []
    hook = eng.model.register_forward_hook(
        lambda module, args, kwargs, out: prefill_rows.append(kwargs["input_ids"].shape)
        if kwargs["input_ids"].shape[1] > 1 else None, with_kwargs=True)
    for sampling in (SamplingParams(temperature=0.0, max_new_tokens=8), SamplingParams(max_new_tokens=8, seed=3)):
        prefill_rows.clear()
        shared = [c for g in eng.generate(prompts, 4, sampling) for c in g]
        assert [rows for rows, _ in prefill_rows] == [2, 2]  # prompts {0, 1} then {1, 2}: one prefill each
        repeated = [g[0] for g in eng.generate([p for p in prompts for _ in range(4)], 1, sampling)]
        assert [c.token_ids for c in shared] == [c.token_ids for c in repeated]
        for a, b in zip(shared, repeated):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    hook.remove()
