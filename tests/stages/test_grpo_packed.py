"""The GRPO update's packed layout (update_layout: packed): [prompt | completion] rows laid end to end give the
shared-prefix logprobs, loss, gradient and step, micro-batched or not; its forward options are refused where they
cannot run, and are not hashed."""

from types import SimpleNamespace

import pytest
import torch

from cascade.artifacts.config import config_hash
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import policy_update, run_grpo
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.recipe.schema import RecipeError
from cascade.stages.scale.distributed import World, process_world
from cascade.stages.train.completions import RowLayout, check_head_reads_decoder, completion_batch, completion_logprobs
from cascade.stages.train.context import ListSink
from cascade.stages.train.losses import groups_with_signal, grpo_advantages
from cascade.stages.train.on_policy_losses import GRPOLoss
from cascade.stages.train.packing import check_forward_options
from cascade.stages.train.tokenizer import load_tokenizer
from tests.stages.test_sft_packing import tiny_qwen2, untied_llama
from tests.stages.test_training import ragged_rollouts, stage_ctx, vowel_recipe, weights

PAD = load_tokenizer().pad_token_id
VOCAB = len(load_tokenizer())
PROMPTS, GROUP = 4, 3


def packed_rows_seen(model) -> list[tuple[int, int]]:
    """The [R, T] shapes the decoder is given, recorded as it runs."""
    shapes = []
    model.get_decoder().register_forward_pre_hook(
        lambda _, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    return shapes


@pytest.mark.parametrize("make_model", [tiny_qwen2, untied_llama], ids=["qwen2-tied", "llama-untied"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_packed_rows_give_the_shared_prefix_logprobs(make_model, temperature, top_p):
    """Prompts of 3-8 tokens, completions of 1-9, in packed rows of the longest row, of 24 and of 64 tokens: each
    sampled token's logprob under (temperature, top_p) and its logits equal the shared prefix's, in fp32."""
    model = make_model(VOCAB)
    batch = completion_batch(ragged_rollouts(VOCAB, prompts=3, group=4, seed=3), PAD, temperature, top_p)
    every = slice(0, len(batch))
    with torch.no_grad():
        want, want_logits = completion_logprobs(model, batch, every, PAD)
        shapes = packed_rows_seen(model)
        for pack_length in (None, 24, 64):
            logp, logits = completion_logprobs(model, batch, every, PAD, RowLayout("packed", pack_length))
            assert logp.shape == batch.mask.shape and logits.shape == want_logits.shape
            torch.testing.assert_close(logp * batch.mask, want * batch.mask, atol=1e-5, rtol=0)
            torch.testing.assert_close(logits * batch.mask[..., None], want_logits * batch.mask[..., None])
            assert bool(logp.isfinite().all())  # padded columns too: the loss multiplies them by 0
    assert all(rows < len(batch) for rows, _ in shapes) and shapes[-1][1] == 64  # packed: fewer, longer rows
    # the comparison can fail: the same packed rows with positions that do not restart attend across rows
    model.get_decoder().register_forward_pre_hook(no_restart, with_kwargs=True)
    with torch.no_grad():
        crossed, _ = completion_logprobs(model, batch, every, PAD, RowLayout("packed", 64))
    assert float(((crossed - want).abs() * batch.mask).max()) > 1e-2


def no_restart(_, args, kwargs):
    ids = kwargs["input_ids"]
    return args, {**kwargs, "position_ids": torch.arange(ids.shape[1]).expand_as(ids)}


def rollouts():
    """Seeded ragged prompts and completions (tests/stages/dist_updates.py's): prompt 1's group is flat."""
    from tests.stages.dist_updates import rollouts as seeded

    return seeded(VOCAB)


def one_update(layout: str, micro_batch_size: int, **grpo):
    """One policy_update of the tiny Qwen2 on fixed rollouts at temperature 0.8 and top_p 0.95, SGD at lr 1 (the
    step is the clipped gradient itself: AdamW would turn float noise on near-zero gradients into +-lr steps).
    Returns its metrics, the weights after it, and the [R, T] of each decoder forward."""
    model = tiny_qwen2(VOCAB)
    shapes = packed_rows_seen(model)
    run = SimpleNamespace(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        tokenizer=SimpleNamespace(pad_token_id=PAD),
        world=process_world(ComputeConfig(device="cpu", dtype="fp32")),
        step=0,
    )
    cfg = GRPOConfig(
        name="rl", domains=["math"], steps=1, lr=1.0, temperature=0.8, top_p=0.95, update_layout=layout,
        micro_batch_size=micro_batch_size, **grpo,
    )  # fmt: skip
    prompts, groups, rewards = rollouts()
    metrics = policy_update(
        run, cfg, GRPOLoss(None, 0.0), prompts, groups, grpo_advantages(rewards, 1e-6), groups_with_signal(rewards)
    )
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}, shapes


def assert_same_update(a, b, tol: float) -> None:
    (metrics, weights_a, _), (want, weights_b, _) = a, b
    for key in ("loss", "grad_norm", "entropy", "logprob_mismatch", "tokens_trained"):
        assert metrics[key] == pytest.approx(want[key], abs=tol), key
    for name, value in weights_a.items():
        torch.testing.assert_close(value, weights_b[name], atol=tol, rtol=0)


def test_a_packed_update_steps_as_the_shared_prefix_one():
    """The kept groups' rows (9 of 12), micro-batches of 4 completion rows: the same loss, gradient norm and
    entropy, and the same weights after the step."""
    shared = one_update("shared_prefix", 4)
    assert abs(shared[0]["loss"]) > 1e-4 and shared[0]["grad_norm"] > 1e-3
    assert_same_update(one_update("packed", 4, pack_length=32), shared, 1e-5)


def test_micro_batched_packed_updates_equal_one_batch():
    """Micro-batches of 4, 2 and 1 completion rows, each packed on its own, split groups across micro-batches:
    the loss is normalized by the step's token count, not each micro-batch's, so all equal one batch of 12."""
    whole = one_update("packed", 12)
    assert len(whole[2]) == 1
    for micro in (4, 2, 1):
        update = one_update("packed", micro)
        assert len(update[2]) == -(-9 // micro)  # one packed forward per micro-batch of the 9 kept rows
        assert_same_update(update, whole, 1e-6)


def grpo_stage(tmp_path, monkeypatch, **grpo):
    """The vowel task's GRPO stage for 2 steps (fp32, the HF engine on the trained module): losses, gradient norms
    and weights. lr 1e-3: AdamW's first steps move a weight by about lr whatever its gradient, so a near-zero
    gradient's rounding moves it by up to lr * its relative error (1e-5 at the task's 1e-2)."""
    tmp_path.mkdir()
    recipe = vowel_recipe(tmp_path, monkeypatch, steps=2, prompts_per_step=4, group_size=4, lr=1e-3, **grpo)
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "rl", sink)
    run_grpo(recipe.stage("rl"), ctx, StageInputs())
    return sink.series("loss"), sink.series("grad_norm"), weights(ctx)


def test_the_grpo_stage_trains_the_same_packed(tmp_path, monkeypatch):
    """Through the stage: its probes, the same rollouts (the engine samples from the trained module) and the same
    two updates, packed and shared-prefix."""
    packed = grpo_stage(tmp_path / "packed", monkeypatch, update_layout="packed", micro_batch_size=8)
    shared = grpo_stage(tmp_path / "shared", monkeypatch, micro_batch_size=8)
    assert packed[0] == pytest.approx(shared[0], abs=1e-5) and packed[1] == pytest.approx(shared[1], abs=1e-5)
    assert len(shared[1]) == 2 and min(shared[1]) > 1e-3  # both steps moved the weights
    for name, value in packed[2].items():
        torch.testing.assert_close(value, shared[2][name], atol=1e-5, rtol=0)


def test_flex_attention_on_the_cpu_is_refused_in_one_line(tmp_path, monkeypatch):
    recipe = vowel_recipe(tmp_path, monkeypatch, update_layout="packed", attention="flex_attention")
    with pytest.raises(RecipeError, match="^stage 'rl': attention flex_attention trains on cuda only") as e:
        run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl"), StageInputs())
    assert "\n" not in str(e.value)


def test_compile_under_torchrun_is_refused():
    cfg = GRPOConfig(name="rl", domains=["math"], update_layout="packed", compile=True)
    compute = ComputeConfig(device="cpu", dtype="fp32")
    check_forward_options(cfg, World(0, 1, torch.device("cpu"), compute, "fp32"))  # one process: fine
    ranks = World(0, 2, torch.device("cpu"), compute, "fp32", distributed=True)
    with pytest.raises(RecipeError, match="^stage 'rl': compile runs in one process only"):
        check_forward_options(cfg, ranks)


@pytest.mark.parametrize("options", [{"compile": True}, {"attention": "flex_attention", "compile": True}])
def test_forward_options_without_the_packed_layout_are_refused(tmp_path, monkeypatch, options):
    """flex attention and compiled layers run the packed update only: the shared prefix's forward on a KV cache
    would be compiles of its own, and is not what they were measured on."""
    with pytest.raises(RecipeError, match="apply to the packed update only.*set update_layout: packed$") as e:
        vowel_recipe(tmp_path, monkeypatch, **options)
    assert "\n" not in str(e.value)
    assert vowel_recipe(tmp_path, monkeypatch, update_layout="packed", **options).stage("rl").compile


def test_the_new_fields_are_not_hashed():
    """How the update runs, not what it computes: a stage's hash (and so its step checkpoints) is the same."""
    plain = GRPOConfig(name="rl", domains=["math"])
    fast = GRPOConfig(
        name="rl", domains=["math"], update_layout="packed", pack_length=2048, attention="flex_attention", compile=True
    )
    assert config_hash(plain) == config_hash(fast)
    assert config_hash(plain) != config_hash(GRPOConfig(name="rl", domains=["math"], micro_batch_size=32))


def test_a_model_whose_logits_are_not_its_head_on_its_decoder_is_refused():
    """A logit scale (as Granite's, or Gemma's softcap) after the head: the packed update, which runs the decoder
    and the head apart, would read other logits; refused before it trains, in one line."""
    model = tiny_qwen2(VOCAB)
    check_head_reads_decoder(model, torch.device("cpu"))
    forward = model.forward

    def scaled(**kwargs):
        out = forward(**kwargs)
        out.logits = out.logits * 1.01
        return out

    model.forward = scaled
    with pytest.raises(ValueError, match="^Qwen2ForCausalLM: its logits are not .*set update_layout: shared_prefix"):
        check_head_reads_decoder(model, torch.device("cpu"))
