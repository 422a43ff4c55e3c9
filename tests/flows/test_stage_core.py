"""One answer to whether a stage is done (stages/execution.py): the Prefect stage task, the stage driver and
`cascade status` read the same store the same way.

The store holds micro's five stages as small committed checkpoints whose manifests name their parents as the kinds
write them (difficulty and if_rl made from sft, math_rl from if_rl): difficulty has a flipped byte, and if_rl was
built again into another checkpoint after math_rl was made from the first one (math_rl keeps a step checkpoint of
that time too). Each caller is handed the same store; a stage that runs goes to a stand-in for the kind, which
records it and hands back what is committed at its key, so nothing trains.
"""

import shutil
import tempfile
from pathlib import Path

import pytest
from prefect import flow

import cascade.stages.scale.launch
from cascade.artifacts import layout
from cascade.artifacts.checkpoint import CheckpointRef, committed, committed_steps, write_checkpoint
from cascade.artifacts.config import config_hash
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.flows.cli.inspection import stage_positions
from cascade.stages.recipe.walk import Made, stage_steps
from cascade.stages.run import run_stages
from cascade.stages.train.context import StageResult
from cascade.tasks.results import result_storage
from cascade.tasks.stage import stage_task
from tests.conftest import micro_recipe

RUN = "core"
DONE = ["sft_data", "sft", "if_rl"]
RUNS = ["difficulty", "math_rl"]


def commit(store: Store, tmp: Path, key: str, cfg, parent: CheckpointRef | None, body: bytes, step=None):
    """A checkpoint of one file at key, made under the stage's config from `parent`."""
    local = Path(tempfile.mkdtemp(dir=tmp))
    (local / "model").mkdir()
    (local / "model" / "weights.bin").write_bytes(body)
    return write_checkpoint(
        store, key, local, stage=cfg.name, step=step, parent=parent, config_hash=config_hash(cfg), metrics={}
    )


@pytest.fixture
def made_store(tmp_path):
    """The store described above, and a pristine copy of it to hand each caller."""
    recipe = micro_recipe(tmp_path, "tracking.enabled=false")
    store = Store.from_config(recipe.storage)
    cfg = {s.name: s for s in recipe.stages}
    key = {step.stage.name: layout.stage_key(RUN, step.index, step.stage.name) for step in stage_steps(recipe)}
    commit(store, tmp_path, key["sft_data"], cfg["sft_data"], None, b"rows")
    sft = commit(store, tmp_path, key["sft"], cfg["sft"], None, b"sft weights")
    commit(store, tmp_path, key["difficulty"], cfg["difficulty"], sft, b"kept prompts")
    first_if_rl = commit(store, tmp_path, key["if_rl"], cfg["if_rl"], sft, b"if_rl weights, first build")
    commit(store, tmp_path, layout.step_key(key["math_rl"], 1), cfg["math_rl"], first_if_rl, b"math_rl step 1", 1)
    commit(store, tmp_path, key["math_rl"], cfg["math_rl"], first_if_rl, b"math_rl weights")
    commit(store, tmp_path, key["if_rl"], cfg["if_rl"], sft, b"if_rl weights, built again")
    weights = Path(store.path(f"{key['difficulty']}/model/weights.bin"))
    weights.write_bytes(b"kept promptz")  # same size: only its sha256 tells
    shutil.copytree(tmp_path / "store", tmp_path / "pristine")
    return recipe, tmp_path


def handed_over(made_store):
    """The store as made, for the next caller."""
    recipe, tmp_path = made_store
    shutil.rmtree(tmp_path / "store")
    shutil.copytree(tmp_path / "pristine", tmp_path / "store")
    return recipe, Store.from_config(recipe.storage)


@pytest.fixture
def ran(monkeypatch):
    """The stages that ran, each with the step checkpoints it could have resumed from when it started."""
    calls: list[tuple[str, list[int]]] = []

    def stand_in(cfg, ctx, inputs):
        calls.append((cfg.name, committed_steps(ctx.store, ctx.key, config_hash(cfg))))
        return StageResult(committed(ctx.store, ctx.key), {})

    monkeypatch.setattr(cascade.stages.scale.launch, "run_stage_where_configured", stand_in)
    return calls


@flow
def stages_as_tasks(recipe, run_id: str) -> None:
    """The cascade flow's stage steps, without its evals: each stage through the stage task."""
    stage_run = stage_task.with_options(result_storage=result_storage(recipe, run_id))
    made = Made()
    for step in stage_steps(recipe):
        made.add(step.stage, stage_run(recipe, run_id, step.stage, step.index, made.inputs(step.stage)))


def test_the_task_the_driver_and_status_agree_on_which_stages_are_done(made_store, ran, prefect_harness):
    recipe, store = handed_over(made_store)
    positions = {name: where for name, where, _ in stage_positions(store, RUN, recipe)}
    assert [name for name, where in positions.items() if where == "committed, skipped"] == DONE
    assert positions["difficulty"].startswith("rebuilt (its checkpoint did not verify: model/weights.bin: sha256")
    assert positions["math_rl"].startswith("rebuilt (its parent if_rl changed (checkpoint ")
    assert positions["math_rl"].endswith("): starts")  # its step checkpoint was made from the old if_rl

    recipe, store = handed_over(made_store)
    summary = run_stages(recipe, RUN)
    assert [name for name, entry in summary.items() if entry.get("adopted")] == DONE
    assert [name for name, _ in ran] == RUNS
    assert summary["math_rl"]["rebuilt"].startswith("its parent if_rl changed")
    assert ran[1] == ("math_rl", [])  # the stale step checkpoint was discarded, not resumed

    ran.clear()
    recipe, store = handed_over(made_store)
    stages_as_tasks(recipe, RUN)
    report = RunReport.load(store, RUN)
    assert [s.name for s in report.stages if s.status == "skipped"] == DONE
    assert [name for name, _ in ran] == RUNS
    assert "did not verify" in report.stage("difficulty").rebuilt
    assert report.stage("math_rl").rebuilt.startswith("its parent if_rl changed")
    assert ran[1] == ("math_rl", [])
