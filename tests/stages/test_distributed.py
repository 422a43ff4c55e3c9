"""2-process gloo training (torchrun + FSDP2) equals one process, and step checkpoints resume across world sizes.

Every run here is the micro recipe's tiny model in fp32 on CPU: SFT 5 steps and a reward model 4 steps through
the stage launcher (stages/scale/launch.py, the path the stage task takes), GRPO and MOPD one update each on fixed
rollouts (tests/stages/dist_updates.py under torchrun)."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.checkpoint import MANIFEST, committed
from cascade.artifacts.store import Store
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.scale.distributed import world_for
from cascade.stages.scale.launch import run_stage_where_configured
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.train.model import build_tiny_model, save_hf
from cascade.stages.train.tokenizer import load_tokenizer
from tests.conftest import micro_recipe
from tests.stages.dist_updates import SMALL, updates

SFT = [
    "stages.sft.steps=5",
    "stages.sft.batch_size=4",
    "stages.sft.micro_batch_size=2",
    "stages.sft.checkpoint_every=3",
    "stages.sft.warmup_steps=1",
    "stages.sft.lr=3e-3",
]  # 5 steps move the loss
ONE, TWO = [], ["compute.nproc_per_node=2"]


def stage_run(recipe, tmp, run_id: str, stage: str, inputs: StageInputs):
    work = tmp / f"work-{run_id}-{stage}"
    work.mkdir(parents=True)
    sink = ListSink()
    ctx = StageContext(recipe, Store.from_config(recipe.storage), run_id, f"runs/{run_id}/{stage}", sink, workdir=work)
    result = run_stage_where_configured(recipe.stage(stage), ctx, inputs)
    weights = load_file(ctx.store.path(f"{result.checkpoint.key}/model/model.safetensors"))
    return sink, weights, result.checkpoint


def sft_data(recipe, tmp):
    ctx = StageContext(
        recipe, Store.from_config(recipe.storage), "data", "runs/data/00-sft_data", ListSink(), workdir=tmp
    )
    return run_sft_data(recipe.stage("sft_data"), ctx, StageInputs()).checkpoint


def sft_ctx(recipe, workdir, run_id, sink):
    workdir.mkdir(parents=True, exist_ok=True)
    return StageContext(
        recipe, Store.from_config(recipe.storage), run_id, f"runs/{run_id}/01-sft", sink, workdir=workdir
    )


def run_sft(tmp, data, run_id, world):
    recipe = micro_recipe(tmp, *SFT, *world)
    sink = ListSink()
    ctx = sft_ctx(recipe, tmp / f"work-{run_id}-{len(world)}", run_id, sink)
    result = run_stage_where_configured(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
    return sink, load_file(ctx.store.path(f"{result.checkpoint.key}/model/model.safetensors")), ctx


def uncommit(ctx):
    """Forget the finished stage (its manifest), as if it had died after its step-3 checkpoint."""
    ctx.store.delete(f"{ctx.key}/{MANIFEST}")
    assert committed(ctx.store, ctx.key) is None and committed(ctx.store, f"{ctx.key}/steps/3") is not None


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    recipe = micro_recipe(tmp, *SFT)
    data_ctx = StageContext(
        recipe, Store.from_config(recipe.storage), "data", "runs/data/00-sft_data", ListSink(), workdir=tmp
    )
    data = run_sft_data(recipe.stage("sft_data"), data_ctx, StageInputs()).checkpoint
    return tmp, data, {"one": run_sft(tmp, data, "one", ONE), "two": run_sft(tmp, data, "two", TWO)}


def assert_same_adamw_weights(a, b):
    """After AdamW steps: the mean difference tiny, a few elements allowed up to 1e-4 (a thirtieth of one step at lr
    3e-3). AdamW divides each gradient by its own running scale, so an element whose gradient is a near-cancelling
    sum turns the reduction order's float noise (one process vs an all-reduce of two) into a visible step: at two
    threads 9 of 148,160 weights differed by over 1e-6 (the largest 1.0e-5) while the mean difference was 2.3e-9.
    A real sharding bug (a rank's gradient lost or doubled) moves most weights by about lr."""
    assert sorted(a) == sorted(b)
    mean = sum((a[k] - b[k]).abs().sum().item() for k in a) / sum(a[k].numel() for k in a)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert mean <= 1e-8 and worst <= 1e-4, (mean, worst)


def test_sft_two_ranks_equal_one_process(sft_runs):
    _, _, runs = sft_runs
    (one, w1, _), (two, w2, _) = runs["one"], runs["two"]
    losses1, losses2 = one.series("loss"), two.series("loss")
    assert len(losses1) == len(losses2) == 5
    assert losses1[-1] < losses1[0] - 0.5  # it trains: the comparison is not of two untouched models
    assert losses2 == pytest.approx(losses1, abs=1e-5)
    assert_same_adamw_weights(w1, w2)
    assert [p for p, _ in two.rows] == [1, 2, 3, 4, 5]  # rank 0's metrics reached this process's sink


# 5 pairs a step on 2 ranks are 2 and 3: the first rank runs an idle micro-batch; 7 held-out pairs split 3 and 4
REWARD_MODEL = {
    "kind": "reward_model",
    "steps": 4,
    "batch_size": 5,
    "micro_batch_size": 2,
    "warmup_steps": 1,
    "lr": 3e-3,
    "pairs": {"kind": "domain", "domain": "chat", "train": 20, "heldout": 7},
}


def run_reward_model(tmp, backbone, run_id, world):
    raw = micro_recipe(tmp, *world).model_dump(mode="json")
    raw["stages"].append({**REWARD_MODEL, "init": str(backbone)})
    recipe = validate_recipe(raw)
    sink = ListSink()
    work = tmp / f"work-{run_id}"
    work.mkdir()
    ctx = StageContext(recipe, Store.from_config(recipe.storage), run_id, f"runs/{run_id}/05-rm", sink, workdir=work)
    result = run_stage_where_configured(recipe.stage("rm"), ctx, StageInputs())
    return sink, load_file(ctx.store.path(f"{result.checkpoint.key}/model/model.safetensors")), result.metrics


def test_reward_model_two_ranks_equal_one_process(tmp_path):
    tok = load_tokenizer()
    backbone = tmp_path / "backbone"
    save_hf(build_tiny_model(micro_recipe(tmp_path).model, len(tok), seed=0), tok, backbone)
    one, w1, metrics1 = run_reward_model(tmp_path, backbone, "one", ONE)
    two, w2, metrics2 = run_reward_model(tmp_path, backbone, "two", TWO)
    initial = load_file(backbone / "model.safetensors")
    moved = max((w1[k] - initial[k]).abs().max().item() for k in w1 if k in initial)
    assert moved > 1e-3 and w1["score.weight"].abs().max() > 1e-3  # it trains: the backbone, and the zero head
    losses1 = one.series("loss")
    assert len(losses1) == 4 and two.series("loss") == pytest.approx(losses1, abs=1e-5)
    assert two.series("train_accuracy") == one.series("train_accuracy")
    assert_same_adamw_weights(w1, w2)
    for key in ("heldout_accuracy", "heldout_margin", "heldout_pairs"):
        assert metrics2[key] == pytest.approx(metrics1[key], abs=1e-4), key
    assert metrics2["heldout_pairs"] == 7 and [p for p, _ in two.rows] == [1, 2, 3, 4, 4]  # rank 0's, and the eval


@pytest.mark.parametrize("written, resumed", [("two", ONE), ("one", TWO)])
def test_step_checkpoint_resumes_across_world_sizes(sft_runs, written, resumed):
    tmp, data, runs = sft_runs
    straight, weights, ctx = runs[written]
    uncommit(ctx)
    sink, resumed_weights, _ = run_sft(tmp, data, written, resumed)
    assert [step for step, _ in sink.rows] == [4, 5]  # continued after step 3, in the other world size
    assert sink.series("loss") == pytest.approx(straight.series("loss")[3:], abs=1e-5)
    assert_same_adamw_weights(resumed_weights, weights)


def test_grpo_and_mopd_updates_two_ranks_equal_one_process(tmp_path):
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "tests.stages.dist_updates",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]  # a failed rank's traceback, not just its exit
    two = torch.load(tmp_path / "updates.pt")
    one = updates(world_for(ComputeConfig(device="cpu", dtype="fp32")))
    initial = build_tiny_model(SMALL, len(load_tokenizer()), seed=0).state_dict()
    for kind in ("grpo", "mopd"):
        moved = max((one[kind]["weights"][k] - initial[k]).abs().max().item() for k in two[kind]["weights"])
        assert moved > 1e-3, kind  # the update is not empty
        for k, value in two[kind]["weights"].items():
            torch.testing.assert_close(value, one[kind]["weights"][k], rtol=0, atol=1e-5)
        assert two[kind]["metrics"]["loss"] == pytest.approx(one[kind]["metrics"]["loss"], abs=1e-5)
        assert two[kind]["metrics"]["grad_norm"] == pytest.approx(one[kind]["metrics"]["grad_norm"], abs=1e-5)
    assert two["mopd"]["metrics"]["truncated_fraction"] < 0.5
    for key in ("reverse_kl/instruct", "reverse_kl/math", "logprob_mismatch"):
        assert two["mopd"]["metrics"][key] == pytest.approx(one["mopd"]["metrics"][key], abs=1e-6)


def test_a_failing_rank_is_a_one_line_stage_failure(tmp_path):
    recipe = micro_recipe(
        tmp_path, *SFT, *TWO, "stages.sft.batch_size=2", "stages.sft.micro_batch_size=1", "compute.nproc_per_node=3"
    )
    ctx = sft_ctx(recipe, tmp_path / "work", "bad", ListSink())
    from cascade.stages.errors import DistributedStageError

    with pytest.raises(DistributedStageError) as e:
        run_stage_where_configured(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": None}))
    assert "\n" not in str(e.value) and "rank" in str(e.value)
    assert ctx.store.list(ctx.key) == []  # nothing written


# torchrun's summary after `kill -9` of rank 1 (tests/faults/test_fault_dead_rank.py, 2026-11-23): rank 0, whose
# collective lost its peer, raised into its error file and was then stopped with SIGTERM; rank 1 is the root cause
TORCHRUN_SUMMARY = """stages.launch FAILED
-------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 12205)  (SIGTERM)
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : {exit_code} (pid: 12206)
=======================================================
"""
ERRORS = {0: "RuntimeError: Connection closed by peer [127.0.0.1]:41109", 1: "ValueError: bad batch"}


@pytest.mark.parametrize(
    "exit_code, errors, expected",
    [
        (-9, [0], "stage sft: rank 1 died (killed by SIGKILL); torchrun log: {log}"),
        (1, [0, 1], "stage sft: rank 1 failed: ValueError: bad batch"),
        (3, [0], "stage sft: rank 1 died (exit code 3); torchrun log: {log}"),
    ],
)
def test_the_failure_line_names_torchruns_root_cause_not_a_peer_that_lost_it(tmp_path, exit_code, errors, expected):
    from cascade.stages.scale.launch import TORCHRUN_LOG, failure_line

    log = tmp_path / TORCHRUN_LOG
    log.write_text(TORCHRUN_SUMMARY.format(exit_code=exit_code))
    for rank in errors:
        (tmp_path / f"error-rank{rank}.txt").write_text(ERRORS[rank])
    assert failure_line("sft", 1, tmp_path) == expected.format(log=log)
