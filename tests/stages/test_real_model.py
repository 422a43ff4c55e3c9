"""A real model trains: smollm2-135m (a Llama with tied embeddings, its own chat template and vocabulary, and a
pad token that is its end-of-turn token) runs SFT, GRPO and MOPD on CPU, and each checkpoint reloads in plain
`transformers` with the logits the stage ended with."""

import pytest
import torch
from transformers import AutoModelForCausalLM

import cascade.stages.domains
import cascade.stages.train.training
from cascade.stages.kinds import kind_of
from cascade.stages.recipe.config_base import SMOLLM2
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.recipe.walk import Made
from cascade.stages.train.context import ListSink
from cascade.stages.train.model import completion_ids, prompt_ids
from tests.stages.test_training import VowelDomain, stage_ctx


def smollm2_recipe(tmp_path, source: str):
    """SFT on two synthetic math rows, GRPO on a task with reward signal from the first step, MOPD toward SFT."""
    on_policy = {"steps": 2, "prompts_per_step": 1, "group_size": 3, "checkpoint_every": 0, "lr": 1e-5}
    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"file://{tmp_path}/store"},
            "model": {"source": source},
            "compute": {"dtype": "fp32"},
            "domains": {
                "math": {"train_size": 2, "heldout_size": 2, "max_new_tokens": 6},
                "vowels": {"train_size": 8, "heldout_size": 2, "max_new_tokens": 6},
            },
            "stages": [
                {
                    "kind": "sft_data",
                    "domains": ["math"],
                    "dedup": {"near": False},
                    "decontamination": {"enabled": False},
                },
                {
                    "kind": "sft",
                    "steps": 3,
                    "batch_size": 2,
                    "micro_batch_size": 1,
                    "lr": 1e-4,
                    "warmup_steps": 0,
                    "checkpoint_every": 0,
                },
                {"kind": "grpo", "name": "rl", "domains": ["vowels"], **on_policy},
                {"kind": "mopd", "domains": ["math"], "teachers": {"math": "sft"}, **on_policy},
            ],
        }
    )


@pytest.fixture(scope="module")
def trained(smollm2_home, tmp_path_factory):
    """Runs the four stages once; stage name -> (ctx, metric sink, (probe ids, the trained model's logits on them))."""
    tmp = tmp_path_factory.mktemp("smollm2-train")
    final_logits = {}
    real_save = cascade.stages.train.training.save_model_checkpoint

    def save_and_probe(ctx, key, model, tokenizer, **kw):
        probe = torch.tensor([prompt_ids(tokenizer, "What is 2+3?") + completion_ids(tokenizer, "\\boxed{5}")])
        with torch.no_grad():
            final_logits[kw["cfg"].name] = probe, model(input_ids=probe).logits.clone()
        return real_save(ctx, key, model, tokenizer, **kw)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(smollm2_home))
        patch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
        cascade.stages.domains.register_domain(VowelDomain())
        patch.setattr(cascade.stages.train.training, "save_model_checkpoint", save_and_probe)
        runs = run_recipe_stages(smollm2_recipe(tmp, SMOLLM2), tmp)
    return {name: (ctx, sink, final_logits.get(name)) for name, (ctx, sink) in runs.items()}


def run_recipe_stages(recipe, tmp) -> dict:
    """Every stage in order, wired as the flow wires it (`Made`): the newest policy, the checkpoints `reads()`
    names and the teachers.
    Returns stage name -> (ctx, metric sink)."""
    out, made = {}, Made()
    for cfg in recipe.stages:
        sink = ListSink()
        ctx = stage_ctx(recipe, tmp, cfg.name, sink)
        made.add(cfg, kind_of(cfg.kind).run(cfg, ctx, made.inputs(cfg)).checkpoint)
        out[cfg.name] = (ctx, sink)
    return out


def reload(ctx) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(ctx.store.path(f"{ctx.key}/model"), dtype=torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rl", "mopd"])
def test_checkpoint_reloads_in_transformers_with_identical_logits(trained, stage):
    ctx, _, (probe, logits) = trained[stage]
    model = reload(ctx)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        again = model(input_ids=probe).logits
    torch.testing.assert_close(again, logits, rtol=0, atol=0)


@pytest.mark.slow
def test_sft_loss_falls_on_a_repeated_batch(trained):
    _, sink, _ = trained["sft"]
    losses = sink.series("loss")
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
    assert losses[0] - losses[2] > 0.1, losses  # a real step on 135M parameters, not rounding noise


@pytest.mark.slow
def test_grpo_and_mopd_move_the_policy(trained, smollm2_home):
    """Each on-policy stage changes the weights it started from, with a finite non-zero gradient every step."""
    before = {name: reload(trained[start][0]) for name, start in (("rl", "sft"), ("mopd", "rl"))}
    for name in ("rl", "mopd"):
        _, sink, _ = trained[name]
        assert len(sink.series("grad_norm")) == 2 and all(0 < g < 1e3 for g in sink.series("grad_norm")), sink.rows
        after = dict(reload(trained[name][0]).named_parameters())
        moved = max(float((p - after[n]).detach().abs().max()) for n, p in before[name].named_parameters())
        assert moved > 1e-6, name
    assert "reverse_kl/math" in trained["mopd"][1].rows[0][1]


def test_any_hf_directory_trains_untied_and_without_a_pad_token(tmp_path, monkeypatch):
    """An HF directory unlike the tiny model: a Llama with untied input and output embeddings, a tokenizer with no
    pad token that pads on the left. SFT, GRPO and MOPD run on it and the checkpoint keeps the two embeddings apart."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cascade.stages.train.tokenizer import load_tokenizer

    tok = load_tokenizer()
    tok.pad_token, tok.padding_side = None, "left"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=None,
        bos_token_id=None,
    )
    model_dir = tmp_path / "untied-llama"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(VowelDomain())
    recipe = smollm2_recipe(tmp_path, str(model_dir))
    sinks = {name: sink for name, (_, sink) in run_recipe_stages(recipe, tmp_path).items()}
    losses = sinks["sft"].series("loss")
    assert losses[0] > losses[1] > losses[2], losses
    assert all(g > 0 for g in sinks["rl"].series("grad_norm")) and len(sinks["rl"].series("grad_norm")) == 2
    assert len(sinks["mopd"].series("grad_norm")) == 2
    trained = reload(stage_ctx(recipe, tmp_path, "mopd"))
    assert not trained.config.tie_word_embeddings
    assert not torch.equal(trained.lm_head.weight, trained.model.embed_tokens.weight)


def test_a_model_without_a_chat_template_is_one_line_of_bad_input(tmp_path):
    from cascade.stages.errors import ModelSourceError
    from cascade.stages.recipe.sections import ModelConfig
    from cascade.stages.train.model import build_tiny_model, load_hf
    from cascade.stages.train.tokenizer import load_tokenizer

    tok = load_tokenizer()
    build_tiny_model(
        ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), len(tok), seed=0
    ).save_pretrained(tmp_path)
    tok.chat_template = None
    tok.save_pretrained(tmp_path)
    with pytest.raises(ModelSourceError, match=r"has no chat template: use an instruct model") as e:
        load_hf(tmp_path)
    assert "\n" not in str(e.value)
