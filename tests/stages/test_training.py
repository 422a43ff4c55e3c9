"""Training stages: micro-batching equals one batch, resume parity, and GRPO learning on a tiny task."""

import dataclasses
import math
import random

import pytest
import torch
from safetensors.torch import load_file

import cascade.stages.domains
from cascade.artifacts.store import Store
from cascade.stages.domains.base import Domain, Item
from cascade.stages.engines.interface import Completion
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo import GRPOConfig
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.kinds.sft.run_sft import pad_batch, run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.sections import ModelConfig
from cascade.stages.train.completions import completion_batch, completion_logprobs
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.losses import grpo_loss, mis_weights, sft_loss, tis_weights, token_logprobs
from cascade.stages.train.model import Example, build_tiny_model
from cascade.stages.train.tokenizer import load_tokenizer
from cascade.stages.train.training import backward_micro_batches
from tests.conftest import micro_recipe

SMALL = ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128)


def grads_of(model):
    return [p.grad.clone() for p in model.parameters()]


def test_sft_micro_batches_equal_one_full_batch():
    tok = load_tokenizer()
    rng = random.Random(0)
    batch = []
    for _ in range(6):  # ragged lengths and response starts
        n = rng.randint(5, 20)
        batch.append(Example([rng.randrange(3, len(tok)) for _ in range(n)], ((rng.randint(1, n - 2), n),)))
    ids, mask = pad_batch(batch, tok.pad_token_id)
    num_tokens = int(mask[:, 1:].sum())
    results = []
    for micro in (6, 4, 1):
        model = build_tiny_model(SMALL, len(tok), seed=0)
        loss = backward_micro_batches(
            len(batch),
            micro,
            lambda part: sft_loss(
                token_logprobs(model(input_ids=ids[part]).logits[:, :-1], ids[part, 1:]), mask[part, 1:], num_tokens
            ),
        )
        results.append((loss, grads_of(model)))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        assert all(torch.allclose(g, g0, atol=1e-6) for g, g0 in zip(grads, results[0][1]))


def ragged_rollouts(vocab: int, prompts: int, group: int, seed: int) -> list[tuple[list[int], Completion]]:
    """Groups of `group` ragged completions of ragged prompts, as (prompt, completion) rows in group order."""
    rng = random.Random(seed)
    rows = []
    for _ in range(prompts):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
        for _ in range(group):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 9))]
            rows.append((prompt, Completion(comp, [-1.0] * len(comp), "", "length")))
    return rows


def test_grpo_micro_batches_equal_one_full_batch():
    """Micro-batches of 2 and 1 rows split groups across micro-batches; each re-forwards its share of a prompt."""
    tok = load_tokenizer()
    batch = completion_batch(ragged_rollouts(len(tok), prompts=2, group=3, seed=1), tok.pad_token_id)
    adv = torch.tensor([random.Random(1).uniform(-2, 2) for _ in range(len(batch))])
    num_tokens = int(batch.mask.sum())
    results = []
    for micro in (6, 2, 1):
        model = build_tiny_model(SMALL, len(tok), seed=0)

        def loss_of(part):
            logp, _ = completion_logprobs(model, batch, part, tok.pad_token_id)
            return grpo_loss(logp, logp.detach(), adv[part], batch.mask[part], num_tokens)

        results.append((backward_micro_batches(len(batch), micro, loss_of), grads_of(model)))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], abs=1e-6)
        assert all(torch.allclose(g, g0, atol=1e-6) for g, g0 in zip(grads, results[0][1]))


def test_completion_batch_lays_out_sampled_tokens_and_shares_prompts():
    same = [5, 6, 7]
    rows = [
        (same, Completion([8, 9], [-0.1, -0.2], "", "stop")),
        (list(same), Completion([10], [-0.3], "", "stop")),
        ([4], Completion([11, 12, 13], [-0.4, -0.5, -0.6], "", "length")),
    ]
    batch = completion_batch(rows, pad=0)
    assert batch.prompts == [[5, 6, 7], [4]] and batch.owner.tolist() == [0, 0, 1]
    assert batch.ids.tolist() == [[8, 9, 0], [10, 0, 0], [11, 12, 13]]
    assert batch.mask.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    torch.testing.assert_close(batch.inf_logp, torch.tensor([[-0.1, -0.2, 0], [-0.3, 0, 0], [-0.4, -0.5, -0.6]]))
    assert batch.select(torch.tensor([False, True, True])).owner.tolist() == [0, 1]


def test_shared_prompt_forward_gives_the_full_rows_loss_and_gradient():
    """Each prompt forwarded once for its group (and, with activation checkpointing, full rows) gives the loss
    and gradient of the plain forward over [prompt | completion] rows."""
    tok = load_tokenizer()
    rows = ragged_rollouts(len(tok), prompts=3, group=4, seed=2)
    batch = completion_batch(rows, tok.pad_token_id)
    adv = torch.tensor([random.Random(2).uniform(-2, 2) for _ in rows])
    num_tokens = int(batch.mask.sum())

    def plain_rows(model):  # the obvious layout: row = prompt + completion, right-padded
        width = max(len(p) + len(c.token_ids) for p, c in rows)
        ids, mask = torch.full((len(rows), width), tok.pad_token_id), torch.zeros(len(rows), width - 1)
        for r, (p, c) in enumerate(rows):
            ids[r, : len(p) + len(c.token_ids)] = torch.tensor(p + c.token_ids)
            mask[r, len(p) - 1 : len(p) - 1 + len(c.token_ids)] = 1
        logp = token_logprobs(model(input_ids=ids).logits[:, :-1], ids[:, 1:])
        return grpo_loss(logp, logp.detach(), adv, mask, num_tokens)

    def shared(model):
        logp, logits = completion_logprobs(model, batch, slice(0, len(rows)), tok.pad_token_id)
        assert logp.shape == batch.mask.shape and logits.shape[:2] == batch.mask.shape
        return grpo_loss(logp, logp.detach(), adv, batch.mask, num_tokens)

    def loss_and_grads(loss_of, checkpointing=False):
        model = build_tiny_model(SMALL, len(tok), seed=0)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        loss = loss_of(model)
        loss.backward()
        return float(loss.detach()), grads_of(model)

    plain = loss_and_grads(plain_rows)
    assert abs(plain[0]) > 1e-3
    for loss, grads in (loss_and_grads(shared), loss_and_grads(shared, checkpointing=True)):
        assert loss == pytest.approx(plain[0], abs=1e-6)
        assert all(torch.allclose(g, g0, rtol=0, atol=1e-6) for g, g0 in zip(grads, plain[1], strict=True))


def stage_ctx(recipe, tmp_path, name, sink=None):
    store = Store.from_config(recipe.storage)
    index = [s.name for s in recipe.stages].index(name)
    return StageContext(recipe, store, "r", f"runs/r/{index:02d}-{name}", sink or ListSink(), workdir=tmp_path)


def weights(ctx):
    return load_file(ctx.store.path(f"{ctx.key}/model/model.safetensors"))


@pytest.mark.parametrize("overrides", [(), ("stages.sft.lora={rank: 4, alpha: 8}",)], ids=["full", "lora"])
def test_sft_resume_parity(tmp_path, monkeypatch, overrides):
    """6 steps straight == 3 steps, crash, resume from the step-3 checkpoint, 3 more steps. With LoRA the step
    checkpoint's model is merged, and the resume must restore the unmerged weights and the adapters' moments."""
    finals, losses = [], []
    for attempt, crash in (("straight", False), ("resumed", True)):
        recipe = micro_recipe(tmp_path / attempt, *overrides)
        data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
        sink = ListSink()
        ctx = stage_ctx(recipe, tmp_path, "sft", sink)
        if crash:
            crash_at_step(monkeypatch, "cascade.stages.kinds.sft.run_sft.clip_and_step", 4)
            with pytest.raises(RuntimeError, match="preempted"):
                run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
            monkeypatch.undo()
            assert [s for s, _ in sink.rows] == [1, 2, 3]
        run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
        finals.append(weights(ctx))
        losses.append(sink.series("loss"))
    assert losses[1][:3] + losses[1][3:] == pytest.approx(losses[0], abs=1e-6)
    for name in finals[0]:
        assert torch.allclose(finals[0][name], finals[1][name], atol=1e-6), name


def crash_at_step(monkeypatch, target: str, step: int):
    import importlib

    module_name, attr = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real = getattr(module, attr)
    calls = []

    def crashing(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise RuntimeError("preempted")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, attr, crashing)


class VowelDomain(Domain):
    """A task a random model has signal on at once: reward = fraction of characters that are vowels."""

    name = "vowels"

    def sample(self, rng):
        word = "".join(rng.choice("bcdfgklmnprst") for _ in range(6))
        return Item(self.name, "", f"Say {word}.", "aeiou", {})

    def grade(self, item, completion):
        return sum(c in "aeiou" for c in completion) / max(1, len(completion))


class HalfFlatVowelDomain(VowelDomain):
    """VowelDomain where about half the prompts score 0 whatever the answer: their groups have no signal."""

    def sample(self, rng):
        item = super().sample(rng)
        return Item(item.domain, "", item.prompt, item.reference, {"flat": rng.random() < 0.5})

    def grade(self, item, completion):
        return 0.0 if item.meta["flat"] else super().grade(item, completion)


def vowel_recipe(tmp_path, monkeypatch, domain=VowelDomain, **grpo):
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(domain())
    from cascade.stages.recipe.schema import validate_recipe

    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/store"},
            "model": SMALL.model_dump(),
            "compute": {"dtype": "fp32"},
            "domains": {"vowels": {"train_size": 200, "heldout_size": 10, "max_new_tokens": 8}},
            "stages": [
                {
                    "kind": "grpo",
                    "name": "rl",
                    "domains": ["vowels"],
                    "steps": 24,
                    "prompts_per_step": 8,
                    "group_size": 8,
                    "lr": 1e-2,
                    "checkpoint_every": 0,
                    **grpo,
                }
            ],
        }
    )


def test_grpo_reward_rises_on_a_tiny_task(tmp_path, monkeypatch):
    recipe = vowel_recipe(tmp_path, monkeypatch)
    sink = ListSink()
    result = run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    rewards = sink.series("reward")
    assert len(rewards) == 24
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.1, (first, last)
    assert result.metrics["engine"] == "hf"
    assert all(0 < k <= 1 for k in sink.series("kept_groups"))
    assert max(sink.series("logprob_mismatch")) < 1e-3  # fp32 train vs fp32 HF engine
    assert all(h > 0 for h in sink.series("entropy"))


@pytest.mark.slow
def test_the_shuffled_reward_control_samples_alike_and_does_not_learn_the_task(tmp_path, monkeypatch):
    """The control trains on the same prompts from the same weights at step 1 (so the same samples and graded
    rewards), but with the rewards permuted across the batch the vowel reward does not rise, where the real stage's
    rises by > 0.1 in the same 24 steps (test_grpo_reward_rises_on_a_tiny_task)."""
    recipe = vowel_recipe(tmp_path / "control", monkeypatch, reward_control="shuffled")
    sink = ListSink()
    run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    graded = vowel_recipe(tmp_path / "graded", monkeypatch, steps=1)
    first = ListSink()
    run_grpo(graded.stage("rl"), stage_ctx(graded, tmp_path, "rl", first), StageInputs())
    rewards = sink.series("reward")
    assert rewards[0] == first.series("reward")[0]  # the same samples; the logged reward is the graded one
    assert sum(rewards[-6:]) / 6 < sum(rewards[:6]) / 6 + 0.05, rewards


def test_grpo_metric_forward_over_dropped_groups_is_optional(tmp_path, monkeypatch):
    """Off, the step never forwards the dropped groups (only the mismatch metric needs them), and learns the same:
    the update touches the kept groups only, so the weights after 3 steps are identical either way."""
    import cascade.stages.kinds.grpo.run_grpo

    trained = {}
    for flag in (True, False):
        recipe = vowel_recipe(tmp_path / str(flag), monkeypatch, steps=3, mismatch_over_dropped=flag)
        calls = []
        real = cascade.stages.kinds.grpo.run_grpo.mismatch_sum
        monkeypatch.setattr(
            cascade.stages.kinds.grpo.run_grpo, "mismatch_sum", lambda *a, **k: calls.append(1) or real(*a, **k)
        )
        sink = ListSink()
        (tmp_path / str(flag)).mkdir(exist_ok=True)
        ctx = stage_ctx(recipe, tmp_path / str(flag), "rl", sink)
        run_grpo(recipe.stage("rl"), ctx, StageInputs())
        assert len(calls) == (3 if flag else 0)  # one metric-only forward per step, or none
        assert len(sink.series("logprob_mismatch")) == 3
        trained[flag] = weights(ctx)
    for name, value in trained[True].items():
        torch.testing.assert_close(trained[False][name], value, rtol=0, atol=0)


def test_grpo_can_keep_flat_groups_as_trl_does(tmp_path, monkeypatch):
    """drop_flat_groups=false backpropagates every group. Flat groups have zero advantage and add no gradient;
    their tokens only grow the loss's normalizer, which scales the gradient by kept/all < 1. AdamW's first step
    moves each weight by lr * g / (|g| + eps): the same direction either way, and never further when scaled."""
    kept, tokens, moved = {}, {}, {}
    start = build_tiny_model(SMALL, len(load_tokenizer()), seed=0).state_dict()
    for drop in (True, False):
        recipe = vowel_recipe(tmp_path / str(drop), monkeypatch, HalfFlatVowelDomain, steps=1, drop_flat_groups=drop)
        sink = ListSink()
        (tmp_path / str(drop)).mkdir(exist_ok=True)
        ctx = stage_ctx(recipe, tmp_path / str(drop), "rl", sink)
        run_grpo(recipe.stage("rl"), ctx, StageInputs())
        (kept[drop],), (tokens[drop],) = sink.series("kept_groups"), sink.series("tokens_trained")
        sampled = sink.series("tokens_sampled")
        moved[drop] = {name: value - start[name] for name, value in weights(ctx).items()}
    assert 0 < kept[True] < 1 and kept[False] == 1.0
    # the same rollouts (same seed, same start): every sampled token trained vs the kept groups' tokens
    assert tokens[False] == sampled[0] and 0 < tokens[True] < tokens[False]
    for name, dropped in moved[True].items():
        assert torch.equal(torch.sign(moved[False][name]), torch.sign(dropped)), name
        assert bool((moved[False][name].abs() <= dropped.abs() + 1e-7).all()), name
    assert sum(float(d.abs().sum()) for d in moved[False].values()) > 0  # the step did move the weights


def test_the_optimizer_decays_matrices_only_with_the_configured_betas():
    from cascade.stages.kinds.sft import SFTConfig
    from cascade.stages.train.training import make_optimizer

    model = build_tiny_model(ModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128), 300, 0)
    cfg = SFTConfig(weight_decay=0.1, adam_betas=(0.8, 0.99))
    optimizer = make_optimizer(model, 1e-3, cfg)
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert decayed["betas"] == plain["betas"] == (0.8, 0.99)
    norms = {id(p) for name, p in model.named_parameters() if "norm" in name}
    assert norms and norms <= {id(p) for p in plain["params"]}
    assert all(p.ndim == 2 for p in decayed["params"]) and len(decayed["params"]) + len(plain["params"]) == len(
        list(model.parameters())
    )
    # a norm gain with no gradient keeps its value under decay; a matrix with no gradient shrinks by lr * wd
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    gain, matrix = model.model.norm.weight, model.model.layers[0].mlp.up_proj.weight
    before_gain, before_matrix = gain.detach().clone(), matrix.detach().clone()
    optimizer.step()
    torch.testing.assert_close(gain.detach(), before_gain, rtol=0, atol=0)
    torch.testing.assert_close(matrix.detach(), before_matrix * (1 - 1e-3 * 0.1), rtol=1e-6, atol=0)


def test_adam_betas_validate_from_a_recipe():
    from cascade.flows.recipes import load_recipe
    from cascade.stages.recipe.schema import RecipeError

    assert load_recipe("micro", ["stages.sft.adam_betas=[0.9, 0.99]"]).stage("sft").adam_betas == (0.9, 0.99)
    with pytest.raises(RecipeError, match="adam_betas"):
        load_recipe("micro", ["stages.sft.adam_betas=[0.9, 1.0]"])


def test_an_on_policy_warmup_ramps_the_learning_rate_then_holds_it(tmp_path, monkeypatch):
    from cascade.stages.train.training import warmup_constant

    assert [warmup_constant(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_constant(0, 0) == 1.0
    recipe = vowel_recipe(tmp_path, monkeypatch, steps=3, warmup_steps=2)
    sink = ListSink()
    run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    assert sink.series("lr") == [5e-3, 1e-2, 1e-2]  # the stage's lr 1e-2, reached at the second step


def test_importance_correction_auto_is_tis_where_the_mismatch_is_real():
    from cascade.stages.train.on_policy_losses import importance_weighting

    recipe_stage = {"kind": "grpo", "name": "rl", "domains": ["math"]}
    auto = GRPOConfig(**recipe_stage)
    assert importance_weighting(auto, "hf", "fp32") is None
    assert importance_weighting(auto, "hf", "bf16").func is tis_weights
    assert importance_weighting(auto, "vllm", "fp32").keywords == {"cap": 2.0}
    assert importance_weighting(GRPOConfig(**recipe_stage, importance_correction="none"), "vllm", "bf16") is None
    mis = importance_weighting(GRPOConfig(**recipe_stage, importance_correction="mis"), "hf", "fp32")
    assert mis.func is mis_weights and mis.keywords == {"low": 0.5, "high": 5.0}
    for bad in ({"is_cap": 0.5}, {"mis_band": (1.0, 5.0)}, {"mis_band": (0.5, 0.9)}):
        with pytest.raises(ValueError, match="is_cap|mis_band"):
            GRPOConfig(**recipe_stage, **bad)


@pytest.mark.parametrize(
    ("correction", "engine_ratio", "corrected"),
    [("tis", 4.0, 1.0), ("tis", 1.5, 0.0), ("mis", 0.25, 1.0), ("mis", 2.0, 0.0), ("none", 4.0, None)],
)
def test_grpo_weights_each_token_by_its_correction_and_logs_the_share_corrected(
    tmp_path, monkeypatch, correction, engine_ratio, corrected
):
    """The engine's logprobs are shifted so that every token's rho = pi_train / pi_inf is engine_ratio: tis
    truncates every token of rho 4 at its cap of 2 and none of rho 1.5; mis masks every token of rho 0.25 and none
    of rho 2; none logs no share. The mismatch is logged as |log rho|, mean and max."""
    import cascade.stages.kinds.grpo.run_grpo as grpo_run

    real_batch = grpo_run.completion_batch

    def shifted_batch(*args, **kwargs):
        batch = real_batch(*args, **kwargs)
        return dataclasses.replace(batch, inf_logp=batch.inf_logp - math.log(engine_ratio) * batch.mask)

    monkeypatch.setattr(grpo_run, "completion_batch", shifted_batch)
    recipe = vowel_recipe(tmp_path, monkeypatch, steps=2, importance_correction=correction)
    sink = ListSink()
    run_grpo(recipe.stage("rl"), stage_ctx(recipe, tmp_path, "rl", sink), StageInputs())
    assert sink.series("logprob_mismatch") == pytest.approx([abs(math.log(engine_ratio))] * 2, abs=1e-4)
    assert sink.series("logprob_mismatch_max") == pytest.approx([abs(math.log(engine_ratio))] * 2, abs=1e-4)
    if corrected is None:
        assert sink.series("is_corrected") == []
    else:
        assert sink.series("is_corrected") == [corrected, corrected]
