"""`compute.launcher: ray` on a Ray cluster of two training nodes on 127.0.0.1, 1 CPU each, and a rollout node that
offers only the custom resource `rollout`, started by this module: three `ray start` processes (a head and two
worker nodes; the command line runs them all on one machine), stopped at its end.

- micro's SFT and one GRPO stage on 2 Ray workers, one per node, equal the 2-rank torchrun run: per-step losses
  and final weights within tests/stages/test_distributed.py's bounds;
- killing one worker's process mid-stage fails `cascade run` with one line naming the rank and its node, and exit
  1; `cascade resume RUN compute.nnodes=1` finishes the stage on one worker from the newest step checkpoint, and
  the checkpoint loads in transformers;
- one vLLM server for a multi-rank stage: micro's GRPO stage with `engine.kind: vllm` on 2 gloo ranks under
  torchrun (rank 0 starts the server) and on 2 Ray workers (the server is a Ray actor on the rollout node) draws the
  rollouts of the one-process vLLM run: the same tokens and rewards at every step, losses and weights within
  test_distributed's bounds, and the weight probe passes after every update; with max_staleness 1 on Ray, step 1's
  batch is sampled during step 0's update (the ranks' shares gathered at the weight sync);
- without Ray installed, a recipe that asks for it is one line and exit 2, with nothing written.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.layout import stage_key, steps_dir
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.infra.ray_local import local_ray_cluster
from cascade.stages.errors import DistributedStageError
from cascade.stages.kinds import StageInputs
from cascade.stages.scale.launch import run_stage_where_configured
from cascade.stages.train.context import ListSink, StageContext
from tests.conftest import micro_recipe
from tests.faults.conftest import KILL_RECIPE, QUIET, cascade
from tests.stages.test_distributed import SFT, assert_same_adamw_weights, sft_data, stage_run
from tests.stages.test_vllm_engine import require_vllm_venv

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.long, pytest.mark.slow]
TORCHRUN = ["compute.nproc_per_node=2"]
RAY_TWO_NODES = ["compute.launcher=ray", "compute.nnodes=2"]
# the completion's length as reward: every group has signal, so each step is an update (math's grader gives the
# 5-step SFT model 0 everywhere, and a step without signal makes none)
GRPO = [
    "stages.math_rl.steps=2",
    "stages.math_rl.prompts_per_step=4",
    "stages.math_rl.group_size=4",
    "stages.math_rl.reward={kind: callable, function: 'tests.stages.test_reward_sources:answer_length'}",
]
AHEAD = ["stages.math_rl.max_staleness=1"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    """Two training nodes of 1 CPU and a rollout node (infra/ray_local.py); the workers import the tests' reward
    function: the repo root on their path."""
    env = {**QUIET, "PYTHONPATH": str(ROOT)}
    with local_ray_cluster(tmp_path_factory.mktemp("ray-home"), env) as address:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)  # the tests' own view
        try:
            yield address
        finally:
            ray.shutdown()


def named_node(line: str) -> bool:
    """The line names a node of the cluster by its id (the nodes share this host's address)."""
    return any(f" ({n['NodeID'][:8]}, pid " in line for n in ray.nodes())


def test_sft_and_grpo_on_two_ray_nodes_equal_two_torchrun_ranks(ray_address, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    data = sft_data(micro_recipe(tmp_path, *SFT, *GRPO), tmp_path)
    runs = {}
    with caplog.at_level(logging.INFO, logger="cascade.stages.scale.launch_ray"):
        for name, world in (("torchrun", TORCHRUN), ("ray", RAY_TWO_NODES)):
            recipe = micro_recipe(tmp_path, *SFT, *GRPO, *world)
            sft = stage_run(recipe, tmp_path, name, "sft", StageInputs(stages={"sft_data": data}))
            grpo = stage_run(recipe, tmp_path, name, "math_rl", StageInputs(policy=sft[2]))
            runs[name] = (sft, grpo)
    for stage in (0, 1):
        (sink_t, weights_t, _), (sink_r, weights_r, _) = runs["torchrun"][stage], runs["ray"][stage]
        losses = sink_t.series("loss")
        assert len(losses) == (5, 2)[stage] and sink_r.series("loss") == pytest.approx(losses, abs=1e-5)
        assert_same_adamw_weights(weights_t, weights_r)
    assert runs["ray"][0][0].series("loss")[-1] < runs["ray"][0][0].series("loss")[0] - 0.5  # SFT trained
    placed = [r.getMessage() for r in caplog.records if "placed" in r.getMessage()]
    assert len(placed) == 2, placed  # SFT, then GRPO: each on both nodes, one rank per node
    nodes = ray.nodes()
    assert all(sum(n["NodeID"][:8] in line for n in nodes if n["Alive"]) == 2 for line in placed), placed


def test_one_vllm_server_serves_two_ranks_under_torchrun_and_on_ray_and_they_draw_one_process_rollouts(
    ray_address, tmp_path, caplog, monkeypatch
):
    require_vllm_venv()
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    recipe = micro_recipe(tmp_path, *SFT, *GRPO)
    sft = stage_run(recipe, tmp_path, "sft", "sft", StageInputs(stages={"sft_data": sft_data(recipe, tmp_path)}))
    runs = {}
    with caplog.at_level(logging.INFO, logger="cascade.stages"):
        for name, world in (
            ("one", []),
            ("torchrun", TORCHRUN),
            ("ray", [*RAY_TWO_NODES, "engine.ray_resources={rollout: 1}"]),
            ("ray, a step ahead", [*RAY_TWO_NODES, "engine.ray_resources={rollout: 1}", *AHEAD]),
        ):
            recipe = micro_recipe(tmp_path, *SFT, *GRPO, "engine.kind=vllm", *world)
            runs[name] = stage_run(recipe, tmp_path, name, "math_rl", StageInputs(policy=sft[2]))
    one, weights_one, _ = runs["one"]
    for name in ("torchrun", "ray"):
        sink, weights, _ = runs[name]
        assert len(sink.series("loss")) == 2, name
        for rollout_metric in ("tokens_sampled", "reward", "response_length"):
            assert sink.series(rollout_metric) == one.series(rollout_metric), (name, rollout_metric)
        assert sink.series("loss") == pytest.approx(one.series("loss"), abs=1e-5), name
        assert_same_adamw_weights(weights_one, weights)
    ahead, ray_sink = runs["ray, a step ahead"][0], runs["ray"][0]
    assert ahead.series("staleness") == [0.0, 1.0]  # step 1's batch was sampled during step 0's update
    for metric in ("tokens_sampled", "reward", "loss"):  # step 0 is on-policy either way
        assert ahead.series(metric)[0] == pytest.approx(ray_sink.series(metric)[0], abs=1e-5), metric
    for name, (sink, _, _) in runs.items():
        probes = sink.series("weight_probe_max_abs_diff")
        assert len(probes) == 2 and max(probes) <= 1e-3, (name, probes)  # the engine's probe_atol
    rollout_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("rollout"))
    messages = [r.getMessage() for r in caplog.records]
    served = [m for m in messages if m.startswith("rollout server placed")]
    assert len(served) == 2 and all(f"({rollout_node[:8]})" in m for m in served), served  # one per Ray run
    ranks = [m for m in messages if "placed: rank 0" in m]
    assert len(ranks) == 2 and not any(rollout_node[:8] in m for m in ranks), ranks  # on the training nodes


def test_a_stage_that_fails_on_a_rank_is_one_line_naming_rank_and_node(ray_address, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", ray_address)
    recipe = micro_recipe(tmp_path, *SFT, *RAY_TWO_NODES, "stages.sft.batch_size=1", "stages.sft.micro_batch_size=1")
    ctx = StageContext(
        recipe, Store.from_config(recipe.storage), "bad", "runs/bad/01-sft", ListSink(), workdir=tmp_path
    )
    with pytest.raises(DistributedStageError) as e:
        run_stage_where_configured(
            recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": sft_data(recipe, tmp_path)})
        )
    line = str(e.value)
    assert "\n" not in line and line.startswith("stage sft: rank ") and named_node(line), line
    assert line.endswith("failed: RecipeError: stage 'sft': batch_size 1 cannot be shared by 2 ranks"), line
    assert ctx.store.list(ctx.key) == []  # nothing written


RUN_ID = "ray-kill"
SFT_STEPS = 8
SFT_KEY = stage_key(RUN_ID, 1, "sft")


def rank_actor_pids() -> list[int]:
    """Processes of Ray rank actors running a stage (their process title names the method)."""
    out = subprocess.run(["pgrep", "-f", "ray::RankActor.run"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def newest_step(store: Store) -> int | None:
    steps = [int(s) for s in store.list_dirs(steps_dir(SFT_KEY)) if s.isdigit()]
    return max((s for s in steps if committed(store, f"{steps_dir(SFT_KEY)}/{s}") is not None), default=None)


def test_a_killed_worker_fails_in_one_line_and_resume_on_one_worker_finishes(ray_address, prefect_api, tmp_path):
    from transformers import AutoModelForCausalLM

    root = f"file://{tmp_path}/store"
    env = dict(
        os.environ, **QUIET, CASCADE_HOME=str(tmp_path / "home"), PREFECT_API_URL=prefect_api, RAY_ADDRESS=ray_address
    )
    store = Store(root)
    proc = cascade(
        [
            "run",
            str(KILL_RECIPE),
            "--run-id",
            RUN_ID,
            f"storage.root={root}",
            "stages.math_rl.steps=1",
            *RAY_TWO_NODES,
            f"stages.sft.steps={SFT_STEPS}",
            "stages.sft.checkpoint_every=2",
        ],
        env,
    )
    deadline, killed_after = time.time() + 180, None
    while time.time() < deadline and proc.poll() is None and killed_after is None:
        step, pids = newest_step(store), rank_actor_pids()
        if step is not None and len(pids) == 2:
            assert step < SFT_STEPS, "the stage finished before the kill"
            os.kill(max(pids), signal.SIGKILL)  # one worker's process; the other rank is in a collective with it
            killed_after = step
        time.sleep(0.05)
    assert killed_after is not None, proc.communicate(timeout=60)[0][-3000:]
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 1, out[-3000:]
    ours = [line for line in out.splitlines() if line.startswith("cascade: error:")]
    assert len(ours) == 1 and "stage sft: rank " in ours[0] and " died" in ours[0] and named_node(ours[0]), out[-3000:]
    assert committed(store, SFT_KEY) is None  # nothing partial adopted
    assert rank_actor_pids() == []  # the other rank was killed with the stage

    resumed = cascade(["resume", RUN_ID, "--store", root, "compute.nnodes=1"], env)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    store.invalidate()
    report = RunReport.load(store, RUN_ID)
    assert [(s.name, s.status) for s in report.stages[1:]] == [("sft", "completed"), ("math_rl", "completed")]
    model_dir = tmp_path / "store" / report.stages[1].checkpoint.removeprefix(f"{root}/") / "model"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        assert torch.equal(loaded[name], tensor), name


def test_without_ray_installed_the_recipe_is_one_line_and_exit_2(tmp_path):
    hide_ray = (
        "import sys; sys.modules['ray'] = None; from cascade.flows.cli import main; "
        "sys.argv = ['cascade'] + sys.argv[1:]; main()"
    )
    home = tmp_path / "home"
    result = subprocess.run(
        [sys.executable, "-c", hide_ray, "run", "micro", "compute.launcher=ray", "--run-id", "x"],
        env={**os.environ, **QUIET, "CASCADE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "compute.launcher ray needs Ray" in lines[0], lines
    assert not (home / "runs").exists() or list((home / "runs").iterdir()) == []
