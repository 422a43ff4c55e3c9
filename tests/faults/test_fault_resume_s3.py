"""Resume parity through the store on s3:// (moto): N steps straight == N/2, preempt, resume, N/2 more, for SFT
and GRPO: the same final weights within 1e-6 and the same loss (reward) curve. Step state (model, optimizer,
RNG, step) makes the round trip through S3 and the manifest/sha256 machinery."""

import pytest
import torch

import cascade.stages.domains
import cascade.stages.train.context
from cascade.stages.domains.base import Domain, Item
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.grpo.run_grpo import run_grpo
from cascade.stages.kinds.sft.run_sft import run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.train.context import ListSink
from tests.faults.conftest import Preempted, new_bucket, preempt_at, s3_recipe, stage_ctx, stage_weights

pytestmark = pytest.mark.slow


class Vowels(Domain):
    """Reward = share of vowels: a random tiny model has signal at once, so every GRPO step updates weights."""

    name = "vowels"

    def sample(self, rng):
        return Item(self.name, "", "Say " + "".join(rng.choice("bcdfgklmnprst") for _ in range(6)) + ".", "aeiou", {})

    def grade(self, item, completion):
        return sum(c in "aeiou" for c in completion) / max(1, len(completion))


def grpo_recipe(s3_url: str):
    return validate_recipe(
        {
            "seed": 0,
            "storage": {"root": f"s3://{new_bucket(s3_url)}/cascade", "endpoint_url": s3_url},
            "model": {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128},
            "compute": {"dtype": "fp32"},
            "domains": {"vowels": {"train_size": 64, "heldout_size": 8, "max_new_tokens": 8}},
            "stages": [
                {
                    "kind": "grpo",
                    "name": "rl",
                    "domains": ["vowels"],
                    "steps": 4,
                    "prompts_per_step": 4,
                    "group_size": 4,
                    "lr": 1e-2,
                    "checkpoint_every": 1,
                }
            ],
        }
    )


def attempt(stage: str, s3_url: str, tmp_path, name: str):
    """(recipe, stage config, a runner for the stage, its ctx, its sink) in a fresh bucket."""
    sink = ListSink()
    if stage == "rl":
        recipe = grpo_recipe(s3_url)
        ctx = stage_ctx(recipe, tmp_path / name, "rl", sink=sink)
        return recipe.stage("rl"), (lambda: run_grpo(recipe.stage("rl"), ctx, StageInputs())), ctx, sink
    recipe = s3_recipe(tmp_path, s3_url, new_bucket(s3_url))
    data = run_sft_data(
        recipe.stage("sft_data"), stage_ctx(recipe, tmp_path / name, "sft_data"), StageInputs()
    ).checkpoint
    ctx = stage_ctx(recipe, tmp_path / name, "sft", sink=sink)
    return (
        recipe.stage("sft"),
        (lambda: run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))),
        ctx,
        sink,
    )


@pytest.mark.parametrize("stage, series", [("sft", "loss"), ("rl", "reward")])
def test_resume_parity_through_s3(s3, tmp_path, monkeypatch, stage, series):
    monkeypatch.setattr(cascade.stages.domains, "_instances", dict(cascade.stages.domains._instances))
    cascade.stages.domains.register_domain(Vowels())
    finals, curves = [], []
    for name in ("straight", "resumed"):
        cfg, run, ctx, sink = attempt(stage, s3.url, tmp_path, name)
        half = cfg.steps // 2
        if name == "resumed":
            with monkeypatch.context() as mp:
                preempt_at(
                    mp, cascade.stages.train.context, "write_checkpoint", half + 1
                )  # after step half+1, before its save
                with pytest.raises(Preempted):
                    run()
            kept = range(max(1, half - cfg.keep_step_checkpoints + 1), half + 1)  # older ones pruned as it ran
            assert sorted(ctx.store.list_dirs(f"{ctx.key}/steps"), key=int) == [str(s) for s in kept]
        run()
        finals.append(stage_weights(ctx))
        curves.append([(step, m[series]) for step, m in sink.rows if series in m])
        if stage == "rl":  # weight parity means something only if steps really updated the weights
            assert all(m["kept_groups"] > 0 for _, m in sink.rows), sink.rows
    straight = dict(curves[0])
    assert sorted(straight) == list(range(1, cfg.steps + 1))
    # every value the preempted-then-resumed run logged (step half+1 twice) is the straight run's at that step
    assert [v for _, v in curves[1]] == pytest.approx([straight[s] for s, _ in curves[1]], abs=1e-6)
    assert sorted(dict(curves[1])) == sorted(straight)
    for name, tensor in finals[0].items():
        assert torch.allclose(tensor, finals[1][name], atol=1e-6), name
