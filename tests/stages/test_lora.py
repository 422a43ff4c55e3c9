"""LoRA through peft: a step moves the adapters only, a checkpoint is a plain HF model with its adapter beside it,
GRPO learns through adapters while its engine samples the adapted policy, a resumed LoRA stage equals an
uninterrupted one, LoRA under torchrun (one rank or two) equals one process, and target modules that match no layer
are refused when the recipe validates."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.config import config_hash
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.recipe.config_base import LoraConfig, OptimizerConfig
from cascade.stages.recipe.schema import RecipeError, validate_recipe
from cascade.stages.recipe.walk import Made
from cascade.stages.scale.launch import run_stage_where_configured
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.lora import add_lora, merged_state_dict, save_adapter
from cascade.stages.train.model import build_tiny_model
from cascade.stages.train.tokenizer import load_tokenizer
from cascade.stages.train.training import clip_and_step, make_optimizer
from tests.conftest import micro_recipe
from tests.stages.test_distributed import SFT, assert_same_adamw_weights, run_sft, sft_data, uncommit
from tests.stages.test_training import SMALL, stage_ctx, vowel_recipe

Q_PROJ = "model.layers.0.self_attn.q_proj"


def adapted_model(rank: int = 4, alpha: float = 8.0, target="all-linear"):
    tok = load_tokenizer()
    model = build_tiny_model(SMALL, len(tok), seed=0)
    return add_lora(model, LoraConfig(rank=rank, alpha=alpha, target_modules=target), seed=0), tok


def test_a_lora_step_moves_only_the_adapters():
    model, tok = adapted_model()
    optimizer = make_optimizer(model, 1e-2, OptimizerConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([tok.encode("Say hello to the adapters.")])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    clip_and_step(model, optimizer, 1e-2, 1.0, float(loss.detach()))
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(".lora_" in k for k in changed)
    assert any(".lora_B." in k for k in changed)  # B starts at zero: the first step moves it
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    adapters = {id(p) for name, p in model.named_parameters() if ".lora_" in name}
    assert optimized == adapters


def test_the_merged_weights_are_w_plus_scaled_ba_and_give_the_adapted_model(tmp_path):
    from peft import PeftModel

    model, tok = adapted_model(rank=4, alpha=8.0, target=["q_proj", "v_proj"])
    with torch.no_grad():  # a trained adapter: B away from its zero start
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    merged = merged_state_dict(model)
    base = model.state_dict()
    a, b = base[f"{Q_PROJ}.lora_A.default.weight"], base[f"{Q_PROJ}.lora_B.default.weight"]
    assert torch.allclose(merged[f"{Q_PROJ}.weight"], base[f"{Q_PROJ}.base_layer.weight"] + 2.0 * b @ a)  # 8 / 4
    plain = build_tiny_model(SMALL, len(tok), seed=1)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    ids = torch.tensor([tok.encode("Merged or not, the same logits.")])
    adapted_logits = model(input_ids=ids).logits
    assert torch.allclose(plain(input_ids=ids).logits, adapted_logits, atol=1e-5)

    save_adapter(model, tmp_path / "adapter", str(tmp_path / "base"))  # peft's format, on the stage's start
    start = build_tiny_model(SMALL, len(tok), seed=0)
    loaded = PeftModel.from_pretrained(start, str(tmp_path / "adapter"))
    assert torch.allclose(loaded(input_ids=ids).logits, adapted_logits, atol=1e-5)


def test_lora_matching_no_layer_is_refused():
    with pytest.raises(ValueError, match="not found in the base model"):
        adapted_model(target=["no_such_proj"])


def test_an_adapter_on_a_tied_output_head_is_refused():
    """The tiny model and SmolLM2 tie the head to the embedding: a merged head would be lost on load."""
    with pytest.raises(ValueError, match="shares its weight with the input embedding"):
        adapted_model(target=["q_proj", "lm_head"])


def test_a_reward_models_targets_are_checked_on_a_classifier_and_a_stored_recipe_is_not_checked_again(tmp_path):
    """A reward model is a sequence classifier: its head is `score`, and it has no `lm_head`."""
    raw = micro_recipe(tmp_path).model_dump(mode="json")
    raw["stages"].append({"kind": "reward_model", "init": "sft", "lora": {"target_modules": ["q_proj", "lm_head"]}})
    with pytest.raises(
        RecipeError,
        match=r"stage 'rm': lora.target_modules \['lm_head'\] match no layer of the model; "
        r"the names that would: down_proj, embed_tokens, gate_proj, k_proj, o_proj, q_proj, score, ",
    ):
        validate_recipe(raw)
    assert validate_recipe(raw, stored=True).stage("rm").lora.target_modules == ["q_proj", "lm_head"]


LORA_SFT = ["stages.sft.lora={rank: 4, alpha: 8}"]
WORLDS = {"torchrun-one-rank": ["compute.launcher=torchrun"], "two-ranks": ["compute.nproc_per_node=2"]}


def adapter(store, key: str) -> dict[str, torch.Tensor]:
    return load_file(store.path(f"{key}/adapter/adapter_model.safetensors"))


@pytest.fixture(scope="module")
def lora_sft(tmp_path_factory):
    """micro's 5-step SFT through LoRA in one process, and its data."""
    tmp = tmp_path_factory.mktemp("lora-sft")
    data = sft_data(micro_recipe(tmp, *SFT), tmp)
    return tmp, data, run_sft(tmp, data, "one", LORA_SFT)


def test_lora_under_torchrun_on_one_rank_and_two_equals_one_process_and_resumes(lora_sft):
    """Under torchrun (FSDP2, even on one rank) the module holds shards: a checkpoint's merged model and adapter are
    made from the gathered weights (from the module's own, the first step checkpoint failed)."""
    tmp, data, (one, merged_one, ctx_one) = lora_sft
    adapter_one = adapter(ctx_one.store, ctx_one.key)
    runs = {world: run_sft(tmp, data, world, [*LORA_SFT, *WORLDS[world]]) for world in WORLDS}
    for world, (sink, merged, ctx) in runs.items():
        assert sink.series("loss") == pytest.approx(one.series("loss"), abs=1e-5), world
        assert_same_adamw_weights(merged, merged_one)
        assert_same_adamw_weights(adapter(ctx.store, ctx.key), adapter_one)
        assert any(".lora_B." in k for k in adapter_one) and not any("lora" in k for k in merged)
        assert set(adapter(ctx.store, f"{ctx.key}/steps/3")) == set(adapter_one)
    assert one.series("loss")[-1] < one.series("loss")[0] - 0.1  # the adapters train
    straight, merged_straight, ctx = runs["torchrun-one-rank"]
    uncommit(ctx)
    resumed, merged_resumed, _ = run_sft(tmp, data, "torchrun-one-rank", [*LORA_SFT, *WORLDS["torchrun-one-rank"]])
    assert [step for step, _ in resumed.rows] == [4, 5]
    assert resumed.series("loss") == pytest.approx(straight.series("loss")[3:], abs=1e-5)
    assert_same_adamw_weights(merged_resumed, merged_straight)


def test_the_gates_lora_recovery_runs_on_two_ranks(lora_sft):
    """The gate's MOPD recovery through LoRA on 2 ranks, from the LoRA SFT checkpoint, taught by the model source:
    each rank samples from an unsharded copy holding the merged weights, and the checkpoint is the plain merged
    model with its adapter, which peft applies on the adapter's base to give the same model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    tmp, _, (_, _, sft_run) = lora_sft
    sft = committed(sft_run.store, sft_run.key)
    overrides = ["gate.recovery={lora: {rank: 4, alpha: 8}, steps: 2, lr: 0.01, prompts_per_step: 4, group_size: 2}"]
    recipe = micro_recipe(tmp, *overrides, *WORLDS["two-ranks"])
    cfg = recipe.gate.recovery.model_copy(update={"name": "recover-sft", "teachers": {"math": "source"}})
    sink = ListSink()
    (tmp / "work-recovery").mkdir()
    ctx = StageContext(
        recipe, sft_run.store, "recovery", "runs/recovery/02-recover-sft", sink, workdir=tmp / "work-recovery"
    )
    result = run_stage_where_configured(cfg, ctx, Made(policy=sft).inputs(cfg))
    assert [step for step, _ in sink.rows] == [1, 2] and max(sink.series("logprob_mismatch")) < 1e-4
    model_dir = ctx.store.path(f"{result.checkpoint.key}/model")
    adapter_dir = ctx.store.path(f"{result.checkpoint.key}/adapter")
    base = json.loads(Path(adapter_dir, "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == ctx.store.path(f"{sft.key}/model")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([load_tokenizer().encode("Two ranks, one adapter.")])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=0)
        moved = merged(input_ids=ids).logits - AutoModelForCausalLM.from_pretrained(base)(input_ids=ids).logits
    assert moved.abs().max() > 1e-3  # the recovery trained


def test_a_stage_without_lora_keeps_its_config_hash(tmp_path):
    """Step checkpoints match their stage by config hash: adding the `lora` field must not orphan old ones."""
    recipe = micro_recipe(tmp_path)
    assert config_hash(recipe.stage("sft")) == "a87c761dc64cc383"  # the hash before `lora` existed
    assert config_hash(micro_recipe(tmp_path, "stages.sft.lora={rank: 4}").stage("sft")) != "a87c761dc64cc383"


def untied_tiny_model(*args, **kwargs):
    model = build_tiny_model(*args, **kwargs)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    return model


def test_grpo_learns_through_lora_and_commits_a_plain_model_with_its_adapter(tmp_path, monkeypatch):
    """The vowel task is learnt through the output head (from a random model, adapters on the layers alone move
    the logits little: their inputs are small), so the model here has its own head, which an adapter may take."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr("cascade.stages.train.model.build_tiny_model", untied_tiny_model)
    lora = {"rank": 8, "alpha": 16.0, "target_modules": ["lm_head", "o_proj", "down_proj"]}
    recipe = vowel_recipe(tmp_path, monkeypatch, lora=lora)
    sink = ListSink()
    ctx = stage_ctx(recipe, tmp_path, "rl", sink)
    result = run_grpo(recipe.stage("rl"), ctx, StageInputs())
    rewards = sink.series("reward")
    first, last = sum(rewards[:6]) / 6, sum(rewards[-6:]) / 6
    assert last > first + 0.1, (first, last)
    h, m, vocab = SMALL.hidden_size, SMALL.intermediate_size, len(load_tokenizer())
    # rank 8: A [8, in] and B [out, 8] per layer: the head, then o_proj and down_proj in each of the 2 layers
    assert result.metrics["trainable_parameters"] == 8 * (h + vocab) + 2 * 8 * ((h + h) + (m + h))
    # the engine samples the adapted policy: with the base weights alone its logprobs would drift from the trainer's
    assert max(sink.series("logprob_mismatch")) < 1e-3
    weights = load_file(ctx.store.path(f"{ctx.key}/model/model.safetensors"))
    assert not any("lora" in k or "base_layer" in k for k in weights)
    model = AutoModelForCausalLM.from_pretrained(ctx.store.path(f"{ctx.key}/model"))
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (SMALL.hidden_size, SMALL.hidden_size)
    adapter = load_file(ctx.store.path(f"{ctx.key}/adapter/adapter_model.safetensors"))
    assert any(k.endswith("lora_B.weight") for k in adapter)


def test_an_sft_adapter_names_a_base_it_reloads_on(tmp_path):
    """micro's SFT through LoRA starts from a model built from its config, saved nowhere else: the checkpoint keeps
    it in base_model/, the adapter's config names that place, and peft's adapter on it gives the merged model."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from cascade.stages.kinds.sft.run_sft import run_sft
    from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data

    recipe = micro_recipe(tmp_path, "stages.sft.lora={rank: 4, alpha: 8}", "stages.sft.steps=2")
    data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
    ctx = stage_ctx(recipe, tmp_path, "sft")
    run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
    adapter = ctx.store.path(f"{ctx.key}/adapter")
    base = json.loads(open(f"{adapter}/adapter_config.json").read())["base_model_name_or_path"]
    assert base == ctx.store.path(f"{ctx.key}/base_model")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    merged = AutoModelForCausalLM.from_pretrained(ctx.store.path(f"{ctx.key}/model")).eval()
    ids = torch.tensor([load_tokenizer().encode("The adapter on its base is the merged model.")])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5, rtol=0)
