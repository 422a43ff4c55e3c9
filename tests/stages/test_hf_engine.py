"""The HF engine's logprobs are the model's, greedy is deterministic, sampling is seeded per row (a row's draws
do not depend on its batch); the lean decode steps (shared prefix, per row, CUDA graphs) equal HF's forward, and any
other architecture falls back to HF's."""

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from cascade.stages.engines.decode import GraphDecoder, HFDecoder, LeanDecoder, lean_supported
from cascade.stages.engines.hf import HFEngine, left_padded
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.engines.sampling import GOLDEN, as_int64, row_keys, sample_next, uniform
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.losses import sampling_logits
from cascade.stages.train.model import build_tiny_model, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer
from tests.conftest import DEVICES, needs_cuda

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def engine(batch_size=8):
    tok = load_tokenizer()
    return HFEngine(build_tiny_model(SMALL, len(tok), seed=1), tok, batch_size=batch_size, seed=0), tok


def full_forward_logprobs(model, prompt, tokens):
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), -1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def assert_logprobs_match_a_full_forward(eng, tok, sampling):
    """Two prompts of different lengths (so one is left-padded), 3 samples each."""
    prompts = [prompt_ids(tok, "Compute 1+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    groups = eng.generate(prompts, 3, sampling)
    assert [len(g) for g in groups] == [3, 3]
    for prompt, group in zip(prompts, groups):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) > 0
            ref = full_forward_logprobs(eng.model, prompt, c.token_ids)
            assert torch.allclose(ref, torch.tensor(c.logprobs), atol=1e-4)


def test_logprobs_match_a_full_forward_with_left_padding():
    eng, tok = engine()
    assert_logprobs_match_a_full_forward(eng, tok, SamplingParams(temperature=1.0, max_new_tokens=12, seed=5))


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
    """n samples of a prompt prefill it once, yet give the tokens and logprobs of n separate copies of it. Sample j
    of seed s draws splitmix64's stream at s + (j + 1) * GOLDEN, so copy j seeded s + j * GOLDEN draws the same."""
    eng, tok = engine(batch_size=6)  # 3 prompts x 4 samples in 6 slots: a prompt's rows split across admissions
    prompts = [prompt_ids(tok, f"Compute {i}+{i}.") for i in range(3)]
    prefill_rows = []
    hook = eng.model.model.register_forward_hook(
        lambda module, args, kwargs, out: (
            prefill_rows.append(kwargs["input_ids"].shape) if kwargs["input_ids"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    seeds = [3, 30, 300]
    copy_seeds = [as_int64(s + j * GOLDEN) for s in seeds for j in range(4)]
    for sampling in (SamplingParams(temperature=0.0, max_new_tokens=8), SamplingParams(max_new_tokens=8)):
        prefill_rows.clear()
        shared = [c for g in eng.generate(prompts, 4, sampling, seeds=seeds) for c in g]
        assert [rows for rows, _ in prefill_rows] == [2, 2]  # prompts {0, 1} then {1, 2}: one prefill each
        repeated = [g[0] for g in eng.generate([p for p in prompts for _ in range(4)], 1, sampling, seeds=copy_seeds)]
        assert [c.token_ids for c in shared] == [c.token_ids for c in repeated]
        for a, b in zip(shared, repeated):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    hook.remove()


def llama_gqa(vocab_size: int):
    """A Llama with grouped-query attention (4 query heads on 2 kv heads) and biased projections."""
    torch.manual_seed(2)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        attention_bias=True,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


def gpt2(vocab_size: int):
    """An architecture the lean decoder does not cover: the engine falls back to HF's forward per step."""
    torch.manual_seed(3)
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=vocab_size,
            n_embd=64,
            n_layer=2,
            n_head=2,
            n_positions=256,
            eos_token_id=2,
            pad_token_id=0,
            bos_token_id=None,
        )
    )


@pytest.mark.parametrize("build", [llama_gqa, gpt2], ids=["llama-gqa", "gpt2-fallback"])
def test_logprobs_match_a_full_forward_on_other_architectures(build):
    tok = load_tokenizer()
    model = build(len(tok)).eval()  # GPT-2 has dropout
    assert lean_supported(model) == (build is llama_gqa)
    assert_logprobs_match_a_full_forward(
        HFEngine(model, tok, batch_size=8, seed=0), tok, SamplingParams(max_new_tokens=10, seed=4)
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", [lambda v: build_tiny_model(SMALL, v, seed=1), llama_gqa], ids=["qwen2", "llama-gqa"])
def test_lean_decode_logits_equal_hf_forward(build, device):
    """Step by step, the lean decoder's logits are HF's forward on the same left-padded cache, within 1e-5 (fp32,
    on the CPU and on cuda)."""
    tok = load_tokenizer()
    model = build(len(tok)).eval().to(device)
    prompts = [prompt_ids(tok, "Compute 1+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long() | (torch.arange(width) >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    ids, mask = ids.to(device), mask.to(device)
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    repeat = torch.tensor([0, 0, 1], device=device)
    caches = [DynamicCache(), DynamicCache()]
    for cache in caches:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache)
    lean, ref = LeanDecoder(model, caches[0], repeat, mask, 6), HFDecoder(model, caches[1], repeat, mask, 6)
    tokens, pos = torch.tensor([5, 6, 7], device=device), position[repeat, -1]
    for _ in range(4):
        pos = pos + 1
        a, b = lean.step(tokens, pos), ref.step(tokens, pos)
        assert a.shape == (3, len(tok)) and (a - b).abs().max() < 1e-5
        tokens = a.argmax(-1)
    # rows 2 and 0 (prompts 1 and 0) go on; then row 2 alone, and prompt 0 leaves the shared prefix cache
    for rows in (torch.tensor([2, 0], device=device), torch.tensor([0], device=device)):
        lean.keep(rows)
        ref.keep(rows)
        tokens, pos = tokens[rows], pos[rows] + 1
        assert (lean.step(tokens, pos) - ref.step(tokens, pos)).abs().max() < 1e-5
    assert len(lean.prefix_keys[0]) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("build", [lambda v: build_tiny_model(SMALL, v, seed=1), llama_gqa], ids=["qwen2", "llama-gqa"])
def test_graph_decode_logits_equal_hf_forward(build, device):
    """The per-row decoder's logits are HF's forward within 1e-5 (fp32), eagerly on the CPU and replayed as CUDA
    graphs on cuda, through drops that shrink the bucket (5 rows -> 3 live in a bucket of 4, a stale row riding
    along) and that remove a whole prompt."""
    tok = load_tokenizer()
    model = build(len(tok)).eval().to(device)
    prompts = [prompt_ids(tok, "Compute 1+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    ids, mask = left_padded(prompts, 0, torch.device(device))
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    repeat = torch.tensor([0, 0, 0, 1, 1], device=device)
    caches = [DynamicCache(), DynamicCache()]
    for cache in caches:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache)
    ours, ref = GraphDecoder(model, caches[0], repeat, mask, 8), HFDecoder(model, caches[1], repeat, mask, 8)
    tokens, pos = torch.tensor([5, 6, 7, 8, 9], device=device), position[repeat, -1]
    # all 5 rows; rows 1, 3, 4 (bucket 4); rows 3, 4: prompt 0 is gone (bucket 2); row 4 alone (bucket 1)
    for rows in (None, [1, 3, 4], [1, 2], [1]):
        if rows is not None:
            rows = torch.tensor(rows, device=device)
            ours.keep(rows)
            ref.keep(rows)
            tokens, pos = tokens[rows], pos[rows]
        for _ in range(2):
            pos = pos + 1
            a, b = ours.step(tokens, pos), ref.step(tokens, pos)
            assert a.shape == (len(tokens), len(tok)) and (a - b).abs().max() < 1e-5
            tokens = a.argmax(-1)
    assert sorted(ours.graphs) == ([1, 2, 4, 5] if device == "cuda" else [])
    with pytest.raises(RuntimeError, match="holds 8 steps"):
        ours.step(tokens, pos + 1)


def engines_on(model, tok, *decoders, batch_size=16):
    return [HFEngine(model, tok, batch_size=batch_size, seed=0, decoder=d) for d in decoders]


@pytest.mark.parametrize("build", [lambda v: build_tiny_model(SMALL, v, seed=1), llama_gqa], ids=["qwen2", "llama-gqa"])
def test_per_row_and_shared_prefix_sample_the_same(build):
    """fp32 on the CPU: the two cache layouts sample the same tokens, greedy and seeded, with logprobs within 1e-5."""
    tok = load_tokenizer()
    per_row, shared = engines_on(build(len(tok)).eval(), tok, "per_row", "shared_prefix", batch_size=8)
    prompts = [prompt_ids(tok, "Compute 1+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    for sampling in (SamplingParams(temperature=0.0, max_new_tokens=10), SamplingParams(max_new_tokens=10, seed=3)):
        a = [c for g in per_row.generate(prompts, 3, sampling) for c in g]
        b = [c for g in shared.generate(prompts, 3, sampling) for c in g]
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert max(abs(x - y) for c, d in zip(a, b) for x, y in zip(c.logprobs, d.logprobs)) < 1e-5


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cuda_graphs_replay_the_eager_step_bit_for_bit(dtype, monkeypatch):
    """On cuda, the captured step gives exactly the eager per-row step's tokens and logprobs, with rows stopping at
    different steps (so buckets shrink and graphs of several sizes replay)."""
    tok = load_tokenizer()
    model = build_tiny_model(SMALL, len(tok), seed=1).eval().to("cuda", dtype)
    eos = torch.tensor([tok.eos_token_id], device="cuda")
    model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_add(
            -1, eos, torch.full((*logits.shape[:-1], 1), 6.0, dtype=logits.dtype, device=logits.device)
        )
    )  # the end of turn made likely: rows stop early and are dropped
    captured = []
    real_capture = GraphDecoder._capture
    monkeypatch.setattr(
        GraphDecoder, "_capture", lambda self, bucket: captured.append(bucket) or real_capture(self, bucket)
    )
    graphs, eager = engines_on(model, tok, "cuda_graphs", "per_row")
    prompts = [prompt_ids(tok, "Compute 2+2."), prompt_ids(tok, "Write 3 words about rain, all in lowercase.")]
    sampling = SamplingParams(max_new_tokens=16, seed=0)
    a = [c for g in graphs.generate(prompts, 8, sampling) for c in g]
    b = [c for g in eager.generate(prompts, 8, sampling) for c in g]
    assert len({len(c.token_ids) for c in a}) > 1 and captured[0] == 16 and min(captured) < 16
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert torch.equal(
        torch.tensor([x for c in a for x in c.logprobs]), torch.tensor([x for c in b for x in c.logprobs])
    )


def test_cuda_graphs_are_refused_on_a_cpu_model():
    tok = load_tokenizer()
    with pytest.raises(ValueError, match="cuda_graphs needs a cuda model"):
        HFEngine(build_tiny_model(SMALL, len(tok), seed=1), tok, decoder="cuda_graphs")
    with pytest.raises(ValueError, match="this gpt2 decodes with hf"):
        HFEngine(gpt2(len(tok)), tok, decoder="per_row")


def test_rows_that_stop_early_leave_the_batch_and_the_rest_stay_exact(monkeypatch):
    """With the end of turn made likely, rows stop at different steps and finished rows are dropped from the
    decode batch; every row's logprobs still equal a full forward's (the hook applies to both)."""
    eng, tok = engine(batch_size=16)
    eos = tok.eos_token_id
    eng.model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_add(
            -1, torch.tensor([eos]), torch.full((*logits.shape[:-1], 1), 4.0)
        )
    )
    kept_rows = []
    real_keep = LeanDecoder.keep
    monkeypatch.setattr(LeanDecoder, "keep", lambda self, rows: kept_rows.append(len(rows)) or real_keep(self, rows))
    prompt = prompt_ids(tok, "Compute 2+2.")
    group = eng.generate([prompt], 16, SamplingParams(max_new_tokens=16, seed=0))[0]
    lengths = sorted(len(c.token_ids) for c in group)
    assert lengths[0] < lengths[-1] and kept_rows and kept_rows[0] < 16
    for c in group:
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == eos) and eos not in c.token_ids[:-1]
        assert torch.allclose(
            full_forward_logprobs(eng.model, prompt, c.token_ids), torch.tensor(c.logprobs), atol=1e-4
        )


def test_inverse_cdf_sampling_follows_the_distribution_and_top_p():
    """sample_next draws token i with probability p_i (chi-square-tight at 20k draws) and never outside top_p."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(20_000, 1)
    lse = logits.logsumexp(-1)
    draw = uniform(row_keys(torch.tensor([0]), 20_000), 0)  # the engine's own uniforms: 20k rows of one prompt
    counts = torch.bincount(sample_next(logits, lse, draw), minlength=4)
    assert torch.allclose(counts / 20_000, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.012)
    cut = sampling_logits(logits, 1.0, 0.7)
    nucleus = sample_next(cut, cut.logsumexp(-1), draw)
    assert set(nucleus.tolist()) == {0, 1}  # 0.5 alone < 0.7; 0.5 + 0.3 reaches it
    assert torch.allclose(torch.bincount(nucleus, minlength=4) / 20_000, torch.tensor([0.625, 0.375, 0, 0]), atol=0.012)
    assert (sample_next(logits[:3], lse[:3], None) == 0).all()


def test_uniform_is_splitmix64_top_24_bits():
    """u = (output `step` of splitmix64 seeded with the key) >>> 40, / 2**24; the expected values were computed once
    with Python integers mod 2**64 (1234567's first outputs, 6457827717110365317 and 3203168211198807973, are
    splitmix64's published ones). Keys at and past 2**63 check the int64 wraparound and the logical shifts."""
    cases = [
        (0, 0, 14819496),
        (1234567, 0, 5873360),
        (1234567, 1, 2913264),
        (2**64 - 1, 2, 3682296),
        (2**63, 7, 6443080),
    ]
    for key, step, top24 in cases:
        u = uniform(torch.tensor([as_int64(key)]), step)
        assert u.dtype == torch.float32 and u.item() == top24 / 2**24


def test_a_rows_draws_do_not_depend_on_its_batch(monkeypatch):
    """At temperature 1, a prompt with its own seed samples the same tokens and logprobs alone, among other prompts
    at another position, with batch_size 1 or one batch for all, and with finished rows compacted away or not."""
    eng, tok = engine()
    eos = tok.eos_token_id
    eng.model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_add(
            -1, torch.tensor([eos]), torch.full((*logits.shape[:-1], 1), 4.0)
        )
    )  # rows stop early: compaction happens
    kept_rows = []
    real_keep = LeanDecoder.keep
    monkeypatch.setattr(LeanDecoder, "keep", lambda self, rows: kept_rows.append(len(rows)) or real_keep(self, rows))
    target = prompt_ids(tok, "Compute 2+2.")
    others = [prompt_ids(tok, "Write 3 words about rain, all in lowercase."), prompt_ids(tok, "Compute 10-7.")]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    runs = []
    layouts = [
        (64, [target], [7]),
        (64, [*others, target], [1, 2, 7]),
        (1, [*others, target], [1, 2, 7]),
        (5, [others[0], target, others[1]], [1, 7, 2]),
    ]  # (batch_size, prompts, their seeds)
    for batch_size, prompts, seeds in layouts:
        eng.batch_size = batch_size
        groups = eng.generate(prompts, 6, sampling, seeds=seeds)
        runs.append(groups[prompts.index(target)])
    assert len({len(c.token_ids) for c in runs[0]}) > 1 and kept_rows  # rows finished at different steps
    for run in runs[1:]:
        assert [c.token_ids for c in run] == [c.token_ids for c in runs[0]]
        for a, b in zip(run, runs[0]):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-6, rtol=0)


def test_prompt_seeds_set_the_draws():
    """Different per-prompt seeds draw differently, the same seed repeats; without seeds, a prompt repeated in one
    call draws differently at each position, and unseeded calls draw afresh."""
    eng, tok = engine()
    p = prompt_ids(tok, "Compute 5-2.")
    sampling = SamplingParams(max_new_tokens=8)
    a, b, a_again = token_ids(eng.generate([p, p, p], 4, sampling, seeds=[1, 2, 1]))
    assert a == a_again and a != b
    same_prompt_twice = token_ids(eng.generate([p, p], 4, replace(sampling, seed=3)))
    assert same_prompt_twice[0] != same_prompt_twice[1]
    assert token_ids(eng.generate([p], 4, sampling)) != token_ids(eng.generate([p], 4, sampling))


def token_ids(groups):
    return [[c.token_ids for c in g] for g in groups]
