"""SFT packing: the layout by hand, and packed rows give the padded batch's loss and gradients (Qwen2 and Llama)."""

import random

import pytest
import torch

from cascade.artifacts.config import config_hash
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft.run_sft import model_rows, pack_batch, pad_batch, run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.context import ListSink
from cascade.stages.train.losses import sft_loss, token_logprobs
from cascade.stages.train.model import Example, build_tiny_model
from cascade.stages.train.tokenizer import load_tokenizer
from cascade.stages.train.training import backward_micro_batches
from tests.conftest import micro_recipe
from tests.stages.test_training import grads_of, stage_ctx, weights

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def test_pack_batch_lays_rows_first_fit_decreasing_with_restarting_positions():
    batch = [
        answered([11, 12, 13, 14, 15], 2),
        answered([21, 22, 23], 1),
        answered([31, 32], 0),
        answered([41, 42, 43, 44], 3),
    ]
    ids, mask, positions = pack_batch(batch, pad=0, pack_length=None)  # width: the longest row, 5
    # decreasing length: 5 -> a row, 4 -> a row (1 left), 3 -> a row, 2 -> the 3's row (the first it fits);
    # then in batch order: [row 0], [rows 1 and 2], [row 3]
    assert ids.tolist() == [[11, 12, 13, 14, 15], [21, 22, 23, 31, 32], [41, 42, 43, 44, 0]]
    assert positions.tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1], [0, 1, 2, 3, 4]]
    # response tokens from each row's first answer token; a row's first token is never a target, even when trained
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 0, 1], [0, 0, 0, 1, 0]]
    wide, _, wide_positions = pack_batch(batch, pad=0, pack_length=9)
    assert wide.tolist() == [[11, 12, 13, 14, 15, 41, 42, 43, 44], [21, 22, 23, 31, 32, 0, 0, 0, 0]]
    assert wide_positions.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3], [0, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert pack_batch(batch, pad=0, pack_length=3)[0].shape == (3, 5)  # a budget below the longest row: its length


def test_a_batch_where_no_rows_fit_together_packs_into_the_padded_batch_itself():
    """Row for row, not reordered: another row order sums the gradient in another float order (docs/LOG.md)."""
    batch = [answered([11, 12, 13], 1), answered([21, 22, 23, 24], 2), answered([31, 32, 33], 0)]  # any two: > 4
    (ids, mask, positions), (want_ids, want_mask, want_positions) = (
        pack_batch(batch, pad=0, pack_length=None),
        model_rows(batch, pad=0, packing=False, pack_length=None),
    )
    assert torch.equal(ids, want_ids) and torch.equal(positions, want_positions)
    assert torch.equal(mask[:, 1:], want_mask[:, 1:])  # the loss reads targets 1..T-1 only


def test_a_conversation_packs_whole_with_loss_on_its_assistant_turns_only():
    """A conversation's two assistant turns (spans 2-4 and 6-8) keep their loss packed behind another row, padded
    alone, and its other turns carry none."""
    conversation = Example([51, 52, 53, 54, 55, 56, 57, 58], ((2, 4), (6, 8)))
    batch = [answered([11, 12, 13], 1), conversation]
    ids, mask, positions = pack_batch(batch, pad=0, pack_length=12)
    assert ids.tolist() == [[11, 12, 13, 51, 52, 53, 54, 55, 56, 57, 58, 0]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 7, 8]]
    assert mask.tolist() == [[0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0]]
    _, padded = pad_batch(batch, pad=0)
    assert padded.tolist() == [[0, 1, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 1, 1]]


def answered(ids: list[int], first: int) -> Example:
    """A single-turn row: its answer runs from `first` to the end."""
    return Example(ids, ((first, len(ids)),))


def ragged_rows(vocab: int, n: int = 10, seed: int = 0) -> list[Example]:
    """Length-skewed rows (a few long, most short) with their response starts."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        length = rng.randint(30, 48) if i % 4 == 0 else rng.randint(4, 14)
        rows.append(answered([rng.randrange(3, vocab) for _ in range(length)], rng.randint(1, length - 2)))
    return rows


def loss_and_grads(model, ids, mask, positions, micro: int, num_tokens: int, **forward):
    def loss_of(part):
        logits = model(input_ids=ids[part], position_ids=positions[part], use_cache=False, **forward).logits
        return sft_loss(token_logprobs(logits[:, :-1], ids[part, 1:]), mask[part, 1:], num_tokens)

    return backward_micro_batches(len(ids), micro, loss_of), grads_of(model)


def tiny_qwen2(vocab: int):
    return build_tiny_model(SMALL, vocab, seed=0)


def untied_llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=2,
        )
    )


@pytest.mark.parametrize("make_model", [tiny_qwen2, untied_llama], ids=["qwen2-tied", "llama-untied"])
def test_packed_and_padded_batches_give_the_same_loss_and_gradients(make_model):
    vocab = len(load_tokenizer())
    rows = ragged_rows(vocab)
    padded = model_rows(rows, pad=0, packing=False, pack_length=None)
    num_tokens = int(padded[1][:, 1:].sum())
    want_loss, want_grads = loss_and_grads(make_model(vocab), *padded, micro=len(rows), num_tokens=num_tokens)
    for pack_length, micro in ((None, 10), (64, 10), (64, 1)):
        packed = model_rows(rows, pad=0, packing=True, pack_length=pack_length)
        assert int(packed[1][:, 1:].sum()) == num_tokens and len(packed[0]) < len(rows)
        loss, grads = loss_and_grads(make_model(vocab), *packed, micro=micro, num_tokens=num_tokens)
        assert loss == pytest.approx(want_loss, abs=1e-5), (pack_length, micro)
        for g, want in zip(grads, want_grads):
            torch.testing.assert_close(g, want, atol=1e-5, rtol=0)
    # the check can fail: the same packed rows with attention across row boundaries (one causal mask) differ
    ids, mask, _ = model_rows(rows, pad=0, packing=True, pack_length=64)
    crossing = torch.arange(ids.shape[1]).expand_as(ids)
    loss, grads = loss_and_grads(make_model(vocab), ids, mask, crossing, micro=10, num_tokens=num_tokens)
    assert max(float((g - want).abs().max()) for g, want in zip(grads, want_grads)) > 1e-2


def sft_losses_and_weights(tmp_path, *overrides: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The micro recipe's SFT stage for 3 steps under overrides: its loss per step and its final weights."""
    tmp_path.mkdir(parents=True)
    recipe = micro_recipe(tmp_path, *overrides, "stages.sft.steps=3", "stages.sft.checkpoint_every=0")
    data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "sft", sink)
    result = run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
    assert result.metrics["steps"] == 3
    return sink.series("loss"), weights(ctx)


def assert_same_training(a, b, tol: float) -> None:
    assert a[0] == pytest.approx(b[0], abs=tol)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=tol, rtol=0)


def test_sft_stage_packed_equals_padded(tmp_path):
    """The micro recipe's SFT stage, packed and padded: the same loss every step and the same weights."""
    packed = sft_losses_and_weights(tmp_path / "packed", "stages.sft.packing=true")
    padded = sft_losses_and_weights(tmp_path / "padded", "stages.sft.packing=false")
    assert_same_training(packed, padded, 1e-5)


def test_compiled_layers_train_the_same_model(tmp_path):
    """compile (the decoder layers and the loss) changes how the forward runs, not what it computes: the same losses
    and weights as eager,
    up to the rounding of a fused kernel's other summation order; and the config hash does not see it."""
    # one packed length for every step: each new shape would be a compile of its own (of the forward and the
    # backward), which on a cold inductor cache is most of this test's time
    fixed = "stages.sft.pack_length=256"
    eager = sft_losses_and_weights(tmp_path / "eager", fixed)
    compiled = sft_losses_and_weights(tmp_path / "compiled", fixed, "stages.sft.compile=true")
    assert_same_training(eager, compiled, 1e-4)
    recipe = micro_recipe(tmp_path / "hash")
    fast = micro_recipe(tmp_path / "hash", "stages.sft.attention=flex_attention", "stages.sft.compile=true")
    assert config_hash(recipe.stage("sft")) == config_hash(fast.stage("sft"))


def test_flex_attention_on_the_cpu_is_refused_before_it_trains(tmp_path):
    recipe = micro_recipe(tmp_path, "stages.sft.attention=flex_attention")
    ctx = stage_ctx(recipe, tmp_path, "sft")
    with pytest.raises(ValueError, match="flex_attention trains on cuda only"):
        run_sft(recipe.stage("sft"), ctx, StageInputs(stages={}))


def test_flex_attention_keeps_packed_rows_apart():
    """The packing probe under flex_attention (forward only: what the CPU has): the row packed behind another
    equals the row alone."""
    from cascade.stages.kinds.sft.run_sft import check_packing_isolates_rows

    model = tiny_qwen2(300)
    model.set_attn_implementation("flex_attention")
    check_packing_isolates_rows(model, torch.device("cpu"))


def test_a_model_that_attends_across_packed_rows_is_refused():
    from cascade.stages.kinds.sft.run_sft import check_packing_isolates_rows

    model = tiny_qwen2(len(load_tokenizer()))
    check_packing_isolates_rows(model, torch.device("cpu"))
    forward = model.forward
    model.forward = lambda position_ids=None, **kwargs: forward(**kwargs)  # position ids dropped: one causal mask
    with pytest.raises(ValueError, match=r"^Qwen2ForCausalLM attends across packed rows .*set packing: false") as e:
        check_packing_isolates_rows(model, torch.device("cpu"))
    assert "\n" not in str(e.value)


def test_a_model_that_leaks_one_percent_across_packed_rows_is_refused():
    """A leak far smaller than a real one's (0.6-1.1 of the logits' scale) is still refused."""
    from cascade.stages.kinds.sft.run_sft import check_packing_isolates_rows

    model = tiny_qwen2(len(load_tokenizer()))
    forward = model.forward

    def leaky(position_ids=None, **kwargs):
        isolated = forward(position_ids=position_ids, **kwargs)
        if position_ids is not None:
            crossing = forward(**kwargs).logits
            isolated.logits = isolated.logits + 0.01 * (crossing - isolated.logits)
        return isolated

    model.forward = leaky
    with pytest.raises(ValueError, match="attends across packed rows"):
        check_packing_isolates_rows(model, torch.device("cpu"))


def test_a_model_with_large_logits_passes_the_probe_though_its_rounding_exceeds_1e_4():
    """The fresh-clone failure: smollm2-135m's logits reach 22 and its packed row rounds 1.2e-4 away from the
    row alone. The tiny model's head scaled 2000x gives logits of that order, and rounding above 1e-4."""
    from cascade.stages.kinds.sft.run_sft import check_packing_isolates_rows

    model = tiny_qwen2(len(load_tokenizer()))
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 2000)  # unties the head
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        alone = model(input_ids=ids[:, 3:]).logits
        packed = model(input_ids=ids, position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]])).logits[:, 3:]
    assert float((alone - packed).abs().max()) > 1e-4  # the old absolute bound refused this model
    check_packing_isolates_rows(model, torch.device("cpu"))
