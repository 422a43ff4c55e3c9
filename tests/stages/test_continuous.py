"""Continuous batching in the HF engine: a row that stops frees its slot for a waiting prompt, every row samples what
it samples in one static batch, the decode steps follow the tokens, and the slots are sized to the memory there is."""

import pytest
import torch

from cascade.stages.engines import hf as hf_module
from cascade.stages.engines.continuous import MEMORY_SHARE, SlotDecoder, available_memory, plan_slots
from cascade.stages.engines.hf import HFEngine
from cascade.stages.engines.interface import SamplingParams
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.model import build_tiny_model, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)
TASKS = [
    "Compute 2+2.",
    "Write 3 words about rain, all in lowercase.",
    "Compute 10-7.",
    "Write exactly 4 words ending with sun.",
    "Compute 1+8-3.",
    "Write 2 lines, each starting with '- '.",
    "Compute 9-9.",
]


def engines(slots: int, eos_boost: float = 3.0):
    """An engine with `slots` rows and one whose single batch holds every row (the static path), on one model
    whose end of turn is made likely (its logit raised by eos_boost), so rows stop at different steps."""
    tok = load_tokenizer()
    model = build_tiny_model(SMALL, len(tok), seed=1)
    eos = tok.eos_token_id
    model.lm_head.register_forward_hook(
        lambda module, inputs, logits: logits.index_add(
            -1, torch.tensor([eos]), torch.full((*logits.shape[:-1], 1), eos_boost)
        )
    )
    return HFEngine(model, tok, batch_size=slots, seed=0), HFEngine(model, tok, batch_size=512, seed=0), tok


def counted_steps(monkeypatch) -> list[int]:
    """A list that grows by one per SlotDecoder step, with the rows it decoded."""
    steps: list[int] = []
    real_step = SlotDecoder.step
    monkeypatch.setattr(
        SlotDecoder,
        "step",
        lambda self, tokens, positions: steps.append(len(tokens)) or real_step(self, tokens, positions),
    )
    return steps


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingParams(max_new_tokens=24, seed=11)


@pytest.mark.parametrize(
    ("n", "sampling", "eos_boost"), [(1, GREEDY, 1.0), (3, GREEDY, 1.0), (1, SAMPLED, 3.0), (3, SAMPLED, 3.0)]
)
def test_freed_rows_take_waiting_prompts_and_every_row_samples_as_in_one_batch(monkeypatch, n, sampling, eos_boost):
    """7 prompts x n rows through 4 slots: each completion has the tokens and logprobs it has in one static batch,
    and the decode ran fewer steps than static batches of 4 would: a batch's time follows its tokens, not its
    longest row. Progress counts prompts as their every row ends."""
    slotted, static, tok = engines(slots=4, eos_boost=eos_boost)
    steps = counted_steps(monkeypatch)
    prompts = [prompt_ids(tok, t) for t in TASKS]
    seen = []
    refilled = slotted.generate(prompts, n, sampling, progress=lambda done, total: seen.append((done, total)))
    decoded = len(steps)
    one_batch = static.generate(prompts, n, sampling)
    assert decoded and len(steps) == decoded  # one batch holds every row: the static path, no slots
    for a_group, b_group in zip(refilled, one_batch, strict=True):
        for a, b in zip(a_group, b_group, strict=True):
            assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0)
    lengths = [len(c.token_ids) for g in one_batch for c in g]
    assert len(set(lengths)) > 2  # rows stopped at different steps
    rows_in_order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # the refill order
    ordered = [len(one_batch[i][j].token_ids) for i in rows_in_order for j in range(n)]
    static_steps = sum(max(ordered[k : k + 4]) for k in range(0, len(ordered), 4))
    assert len(steps) < static_steps and max(steps) <= 4
    assert seen[-1] == (len(prompts), len(prompts)) and [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_the_slots_are_sized_to_the_memory_available(monkeypatch):
    """With memory for 3 rows' KV cache the engine decodes 3 at once, says so before it starts, and samples what it
    samples with 16; with memory for less than one row it refuses in one line, naming the sizes."""
    slotted, _, tok = engines(slots=16)
    prompts = [prompt_ids(tok, t) for t in TASKS] * 3
    sampling = SamplingParams(max_new_tokens=16, seed=2)
    roomy = slotted.generate(prompts, 1, sampling)
    assert slotted.last_plan.slots == 16
    width = max(map(len, prompts)) + 16
    per_row = plan_slots(slotted.model, 1, 1, width, 1 << 40).cache_bytes
    monkeypatch.setattr(hf_module, "available_memory", lambda: int(3.5 * per_row / MEMORY_SHARE))
    said = []
    slotted.announce = said.append
    tight = slotted.generate(prompts, 1, sampling)
    assert slotted.last_plan.slots == 3 and slotted.last_plan.cache_bytes == 3 * per_row
    assert said == [f"{len(prompts)} prompts x 1: {slotted.last_plan.describe()}"] and "3 rows" in said[0]
    assert [c.token_ids for g in tight for c in g] == [c.token_ids for g in roomy for c in g]
    monkeypatch.setattr(hf_module, "available_memory", lambda: int(0.5 * per_row / MEMORY_SHARE))
    with pytest.raises(MemoryError, match=rf"one row of {width} tokens needs a KV cache of .* MiB are available"):
        slotted.generate(prompts, 1, sampling)


def test_available_memory_is_the_least_of_the_host_and_the_cgroup(tmp_path):
    """MemAvailable, and a cgroup's limit less its usage (v2 or v1), whichever is smaller; "max" and v1's huge
    no-limit value are no limit."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8388608 kB\n")
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    assert available_memory(meminfo, (v2, v1)) == 8 * 2**30  # no cgroup files: the host's figure
    (v2 / "memory.max").write_text("max\n"), (v2 / "memory.current").write_text("1000\n")
    (v1 / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n"), (v1 / "memory.usage_in_bytes").write_text("1\n")
    assert available_memory(meminfo, (v2, v1)) == 8 * 2**30
    (v2 / "memory.max").write_text(f"{2 * 2**30}\n"), (v2 / "memory.current").write_text(f"{2**29}\n")
    assert available_memory(meminfo, (v2, v1)) == 3 * 2**29  # 2 GiB limit, 0.5 GiB used
    (v1 / "memory.limit_in_bytes").write_text(f"{2**30}\n"), (v1 / "memory.usage_in_bytes").write_text(f"{2**31}\n")
    assert available_memory(meminfo, (v2, v1)) == 0  # over its limit already: nothing left, never negative
