"""RLHF: the chat domain's rubric and pairs, the reward_model stage, and a GRPO stage rewarded by it with KL."""

import json

import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, Qwen2Config, Qwen2ForSequenceClassification

from cascade.artifacts.store import Store
from cascade.flows.recipes import load_recipe
from cascade.stages.domains import get_domain
from cascade.stages.domains.chat import NEAR_MISSES, near_miss, rubric
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.kinds.reward_model.run_reward_model import pair_scores, run_reward_model, shared_prefix_rows
from cascade.stages.kinds.sft.run_sft import run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.model import completion_ids, prompt_ids
from cascade.stages.train.tokenizer import load_tokenizer
from tests.conftest import DEVICES

BROKEN = {
    "off_topic": {"on_topic"},
    "wrong_tone": {"tone"},
    "padded": {"length"},
    "repetitive": {"no_repetition", "on_topic"},
    "other_entity": {"entity"},
    "cut_off": {"length", "tone"},
    "garbled": {"on_topic"},
}


def test_chat_gold_passes_every_check_and_each_near_miss_breaks_its_own():
    import random

    items = get_domain("chat").generate("heldout", 200, seed=0)
    rng = random.Random(0)
    for item in items:
        assert all(rubric(item.meta, item.reference).values()), item
        for kind in NEAR_MISSES:
            checks = rubric(item.meta, near_miss(item.meta, item.reference, kind, rng))
            assert {name for name, ok in checks.items() if not ok} == BROKEN[kind], (item, kind)


def test_chat_rubric_gives_fifths_and_generation_is_seeded_with_disjoint_splits():
    chat = get_domain("chat")
    item = chat.generate("train", 1, seed=0)[0]
    entity, tone = item.meta["entity"], item.meta["tone"]
    assert chat.grade(item, "") == 0.0
    assert chat.grade(item, f"{entity} {entity}") == pytest.approx(1 / 5)  # names the entity, nothing else
    assert chat.generate("train", 50, seed=3) == chat.generate("train", 50, seed=3)
    train = {i.prompt for i in chat.generate("train", 2000, seed=0)}
    assert not train & {i.prompt for i in chat.generate("heldout", 300, seed=0)}
    pairs = chat.pairs("heldout", 10, seed=0)
    assert pairs == chat.pairs("heldout", 10, seed=0) and all(p.chosen != p.rejected for p in pairs)
    assert tone in item.prompt


MICRO_RLHF = {
    "seed": 0,
    "model": {"source": "tiny", "hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
    "compute": {"dtype": "fp32"},
    "domains": {"chat": {"train_size": 64, "heldout_size": 16, "max_new_tokens": 12}},
    "stages": [
        {"kind": "sft_data"},
        {"kind": "sft", "steps": 4, "batch_size": 8, "micro_batch_size": 8, "warmup_steps": 1},
        {
            "kind": "reward_model",
            "init": "sft",
            "steps": 6,
            "warmup_steps": 2,
            "batch_size": 8,
            "micro_batch_size": 4,
            "pairs": {"kind": "domain", "domain": "chat", "train": 32, "heldout": 16},
        },
        {
            "kind": "grpo",
            "name": "rlhf",
            "domains": ["chat"],
            "steps": 2,
            "prompts_per_step": 4,
            "group_size": 4,
            "micro_batch_size": 5,
            "kl_coef": 0.03,
            "reward": {"kind": "reward_model", "stage": "rm"},
        },
    ],
}


def micro_rlhf(tmp_path, **changes):
    doc = {**MICRO_RLHF, **changes}
    path = tmp_path / "micro-rlhf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_recipe(str(path), [f"storage.root=file://{tmp_path}/store"])


def run_stages(recipe, tmp_path, upto: str) -> tuple[dict, dict]:
    """Runs the recipe's stages in order up to `upto`; (checkpoint by stage name, sink by stage name)."""
    store, made, sinks = Store.from_config(recipe.storage), {}, {}
    runs = {"sft_data": run_sft_data, "sft": run_sft, "reward_model": run_reward_model, "grpo": run_grpo}
    for index, stage in enumerate(recipe.stages):
        sinks[stage.name] = ListSink()
        ctx = StageContext(recipe, store, "r", f"runs/r/{index:02d}-{stage.name}", sinks[stage.name], workdir=tmp_path)
        policy = made.get("sft") if stage.kind == "grpo" else None
        inputs = StageInputs(policy=policy, stages={r.stage: made[r.stage] for r in stage.reads()})
        made[stage.name] = runs[stage.kind](stage, ctx, inputs).checkpoint
        if stage.name == upto:
            return made, sinks
    return made, sinks


def test_reward_model_checkpoint_is_a_transformers_classifier_with_the_stage_metrics(tmp_path):
    recipe = micro_rlhf(tmp_path)
    made, sinks = run_stages(recipe, tmp_path, "rm")
    local = tmp_path / "store" / made["rm"].key
    manifest = json.loads((local / "MANIFEST.json").read_text())
    # the score head starts at zero: every pair's first loss is exactly log 2
    assert sinks["rm"].series("loss")[0] == pytest.approx(0.6931472, abs=1e-6)
    model = AutoModelForSequenceClassification.from_pretrained(str(local / "model")).eval()
    assert model.config.num_labels == 1
    tok = load_tokenizer(local / "model")
    margins = []
    for pair in get_domain("chat").pairs("heldout", 16, seed=0):
        with torch.no_grad():
            chosen, rejected = (
                float(
                    model(input_ids=torch.tensor([prompt_ids(tok, pair.prompt) + completion_ids(tok, a)])).logits[0, 0]
                )
                for a in (pair.chosen, pair.rejected)
            )
        margins.append(chosen - rejected)
    # transformers' own load, one sequence at a time (no padding), gives the stage's figures
    assert manifest["metrics"]["heldout_accuracy"] == pytest.approx(sum(m > 0 for m in margins) / 16, abs=1e-9)
    assert manifest["metrics"]["heldout_margin"] == pytest.approx(sum(margins) / 16, abs=1e-4)
    assert manifest["metrics"]["dtype"] == "fp32"  # the recipe's compute.dtype, recorded with the stage's figures


@pytest.mark.parametrize("device", DEVICES)
def test_a_pairs_shared_prompt_runs_once_and_scores_equal_each_sequence_alone(device):
    """pair_scores lays a pair out as [prompt | chosen's rest | rejected's rest]: the scores and their gradients
    equal those of each sequence run alone, also where the answers share leading tokens or one answer is a prefix
    of the other; the row is shorter than the two sequences. fp32, on the CPU and on cuda (SDPA takes the boolean
    mask there too)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=48,
        num_labels=1,
        pad_token_id=0,
    )
    model = Qwen2ForSequenceClassification(config).eval().to(device)
    model.set_attn_implementation("sdpa")
    prompt_a, prompt_b = [3, 4, 5, 6, 7, 8], [9, 10, 11]
    pairs = [
        (prompt_a + [20, 21, 22], prompt_a + [23]),
        (prompt_b + [30, 31, 32, 33], prompt_b + [30, 31, 40]),  # the answers share two tokens
        (prompt_b + [41, 42], prompt_b + [41, 42, 43]),
    ]  # chosen is a prefix of rejected

    def alone(seq):
        return model(input_ids=torch.tensor([seq], device=device)).logits[0, 0]

    chosen, rejected = pair_scores(model, pairs, pad=0)
    ref_chosen = torch.stack([alone(c) for c, _ in pairs])
    ref_rejected = torch.stack([alone(r) for _, r in pairs])
    assert torch.allclose(chosen, ref_chosen, atol=1e-5) and torch.allclose(rejected, ref_rejected, atol=1e-5)
    grads = []
    for a, b in ((chosen, rejected), (ref_chosen, ref_rejected)):
        model.zero_grad()
        (a - 2 * b).sum().backward(retain_graph=True)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    ids, _, allowed, ends = shared_prefix_rows(pairs, pad=0)
    assert ids.shape[1] == 10 < max(len(c) + len(r) for c, r in pairs)  # pair 0: 6 + 3 + 1 columns, not 16
    assert ends.tolist() == [[8, 9], [6, 7], [4, 6]]
    assert not allowed[1, 7, 6] and allowed[1, 7, 4] and allowed[1, 6, 5]  # rejected's rest never reads chosen's


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8.0}], ids=["full", "lora"])
def test_reward_model_resumes_from_its_step_checkpoint_as_a_classifier(tmp_path, lora):
    """With `checkpoint_every` (none by default), a cut-off stage continues from its newest step checkpoint, read
    back as the one-label classifier it trains, and ends where the straight run ended. With LoRA the fresh score
    head trains whole beside the adapters, and the checkpoint is a plain classifier all the same."""
    from safetensors.torch import load_file

    from cascade.artifacts.checkpoint import MANIFEST

    changes = {"checkpoint_every": 3, **({"lora": lora} if lora else {})}
    stages = [{**s, **changes} if s["kind"] == "reward_model" else s for s in MICRO_RLHF["stages"]]
    recipe = micro_rlhf(tmp_path, stages=stages)
    made, sinks = run_stages(recipe, tmp_path, "rm")
    store = Store.from_config(recipe.storage)
    straight = load_file(store.path(f"{made['rm'].key}/model/model.safetensors"))
    store.delete(f"{made['rm'].key}/{MANIFEST}")  # as if the stage died after its step-3 checkpoint
    sink = ListSink()
    ctx = StageContext(recipe, store, "r", made["rm"].key, sink, workdir=tmp_path)
    resumed = run_reward_model(recipe.stage("rm"), ctx, StageInputs(stages={"sft": made["sft"]})).checkpoint
    assert [step for step, _ in sink.rows] == [4, 5, 6, 6]  # steps 4-6, then the held-out metrics
    assert sink.series("loss") == pytest.approx(sinks["rm"].series("loss")[3:], abs=1e-6)
    weights = load_file(store.path(f"{resumed.key}/model/model.safetensors"))
    assert set(weights) == set(straight) and not any("lora" in k for k in weights)
    assert all(torch.allclose(weights[k], straight[k], atol=1e-6) for k in straight)
    assert float(weights["score.weight"].abs().sum()) > 0  # the head left its zero start


def test_reward_model_selection_commits_the_best_checked_step_and_stops_on_patience(tmp_path):
    """select_every scores pairs held back from training; the checkpoint holds the best check's weights (its
    margin on those pairs is the logged one), and patience ends the stage early."""
    from cascade.stages.kinds.reward_model.run_reward_model import encode_pairs, pairwise_metrics
    from cascade.stages.scale.distributed import process_world

    rm = {**MICRO_RLHF["stages"][2], "steps": 12, "lr": 3e-3, "select_every": 2, "select_pairs": 8, "patience": 2}
    recipe = micro_rlhf(tmp_path, stages=[*MICRO_RLHF["stages"][:2], rm])
    made, sinks = run_stages(recipe, tmp_path, "rm")
    checks = {step: m for step, m in sinks["rm"].rows if "select_accuracy" in m}
    metrics = json.loads((tmp_path / "store" / made["rm"].key / "MANIFEST.json").read_text())["metrics"]
    best = max(checks, key=lambda step: (checks[step]["select_accuracy"], -step))  # ties keep the earlier
    assert metrics["selected_step"] == best and metrics["select_accuracy"] == checks[best]["select_accuracy"]
    # patience 2: the stage stopped two checks after its best one, before its 12 steps
    assert max(checks) == best + 2 * 2 < 12 and metrics["steps"] == max(checks)
    assert len(sinks["rm"].series("loss")) == max(checks)
    assert metrics["train_pairs"] == 32 - 8
    local = tmp_path / "store" / made["rm"].key / "model"
    model = AutoModelForSequenceClassification.from_pretrained(str(local)).eval()
    tok = load_tokenizer(local)
    selection = encode_pairs(tok, get_domain("chat").pairs("train", 32, seed=0))[-8:]
    scored = pairwise_metrics(model, process_world(recipe.compute), selection, tok.pad_token_id, 8)
    assert scored["heldout_margin"] == pytest.approx(checks[best]["select_margin"], abs=1e-4)
    assert abs(scored["heldout_margin"] - checks[max(checks)]["select_margin"]) > 1e-3  # not the last step's


@pytest.mark.parametrize(
    "change, message",
    [
        ({"checkpoint_every": 4}, "set checkpoint_every to 0"),
        ({"patience": 2}, "set select_every too"),
    ],
)
def test_reward_model_selection_refuses_settings_it_cannot_honour(tmp_path, change, message):
    rm = {**MICRO_RLHF["stages"][2], "select_every": 2, **change}
    if "select_every" not in change and "patience" in change:
        rm.pop("select_every")
    with pytest.raises(Exception, match=message):
        micro_rlhf(tmp_path, stages=[*MICRO_RLHF["stages"][:2], rm])


def test_rlhf_logs_reward_model_and_rubric_side_by_side_and_kl_starts_at_zero(tmp_path):
    recipe = micro_rlhf(tmp_path)
    made, sinks = run_stages(recipe, tmp_path, "rlhf")
    rows = [m for _, m in sinks["rlhf"].rows]
    assert len(rows) == 2 and all({"rm_score", "rubric_score", "kl"} <= set(m) for m in rows)
    assert rows[0]["kl"] == 0.0  # step 1 trains the reference's own weights: k3 is exactly zero
    assert rows[1]["kl"] > 0.0
    assert all(0.0 <= m["rubric_score"] <= 1.0 for m in rows)


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_pairs_from_a_file_hold_out_the_last_rows(tmp_path, suffix):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cascade.stages.kinds.reward_model import RewardModelConfig
    from cascade.stages.kinds.reward_model.run_reward_model import file_pairs

    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": f"bad {i}", "extra": i} for i in range(10)]
    path = tmp_path / f"pairs.{suffix}"
    if suffix == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RewardModelConfig(init="sft", pairs={"kind": "file", "path": str(path), "heldout_share": 0.2})
    train, heldout = file_pairs(cfg.pairs)
    assert [p.prompt for p in train] == [f"q{i}" for i in range(8)]
    assert [(p.prompt, p.chosen, p.rejected) for p in heldout] == [("q8", "good 8", "bad 8"), ("q9", "good 9", "bad 9")]


def test_on_policy_pairs_put_the_policys_best_graded_answer_over_its_worst_and_skip_ties(tmp_path):
    """`pairs: {kind: on_policy}` samples the init policy `samples` times per prompt and labels with the domain's
    grader: chosen is a best-graded answer, rejected a worst one, and a prompt whose answers all grade the same
    gives no pair. The same seed gives the same pairs."""
    from cascade.stages.engines import SamplingParams, make_engine
    from cascade.stages.kinds.reward_model.run_reward_model import load_pairs
    from cascade.stages.train.rollout import step_seed

    pairs_cfg = {"kind": "on_policy", "domain": "chat", "train": 24, "heldout": 8, "samples": 4}
    stages = [{**s, "pairs": pairs_cfg} if s["kind"] == "reward_model" else s for s in MICRO_RLHF["stages"]]
    recipe = micro_rlhf(tmp_path, stages=stages)
    made, _ = run_stages(recipe, tmp_path, "sft")
    ctx = StageContext(recipe, Store.from_config(recipe.storage), "r", "runs/r/02-rm", ListSink(), workdir=tmp_path)
    train, heldout = load_pairs(recipe.stage("rm"), ctx, StageInputs(stages={"sft": made["sft"]}))
    assert (train, heldout) == load_pairs(recipe.stage("rm"), ctx, StageInputs(stages={"sft": made["sft"]}))

    chat = get_domain("chat")
    items = chat.generate("train", 24, seed=0)
    model, tok = load_checkpoint_of(recipe, made["sft"], tmp_path)
    engine = make_engine(recipe.engine, model, tok, seed=0)
    groups = engine.generate(
        [prompt_ids(tok, it.prompt) for it in items],
        4,
        SamplingParams(max_new_tokens=12, seed=step_seed(0, "rm-pairs:train", 0)),
    )
    expected = []
    for item, group in zip(items, groups):
        grades = [chat.grade(item, c.text) for c in group]
        if max(grades) > min(grades):
            expected.append((item.prompt, max(grades), min(grades)))
    assert 0 < len(expected) < 24  # some prompts tie (no pair), some do not
    by_prompt = {it.prompt: it for it in items}
    assert [
        (p.prompt, chat.grade(by_prompt[p.prompt], p.chosen), chat.grade(by_prompt[p.prompt], p.rejected))
        for p in train
    ] == expected
    assert len(heldout) <= 8 and {p.prompt for p in heldout} <= {it.prompt for it in chat.generate("heldout", 8, 0)}


def load_checkpoint_of(recipe, ref, workdir):
    from cascade.stages.train.context import load_checkpoint

    return load_checkpoint(recipe, Store.from_config(recipe.storage), ref, workdir)
