"""A committed stage whose checkpoint no longer verifies is rebuilt on resume, never adopted, and gc never deletes
what it cannot parse.

One micro run is made once; each case restores its store in place, damages one stage (a truncated manifest, a
deleted manifest, a flipped byte in the model), resumes, and must reach the straight run's final weights with the
damaged stage marked `rebuilt` in the report. Before the fix, resume adopted the damaged stage (Prefect's cached
result names it), and gc then deleted the model as orphaned. A stage rebuilt into another checkpoint takes every
stage made from it along: each is rebuilt from the new one.
"""

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import cascade.stages.kinds.sft.run_sft
from cascade.artifacts.checkpoint import committed
from cascade.artifacts.gc import gc
from cascade.artifacts.layout import steps_dir
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.flows.cli.inspection import stage_positions
from tests.conftest import micro_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
RUN = "rt1"


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """One micro run, and a pristine copy of its store (checkpoints and Prefect's persisted stage results)."""
    root = tmp_path_factory.mktemp("straight")
    recipe = micro_recipe(root)
    cascade_flow(recipe, RUN)
    shutil.copytree(root / "store", root / "pristine")
    return root, recipe, load_file(root / f"store/runs/{RUN}/04-math_rl/model/model.safetensors")


def fresh_run(straight):
    """The run's store as the straight run left it, at the same place: resume sees the same cache keys, so a
    stale Prefect result would be a cache hit, the path that adopted damaged stages."""
    root, recipe, _ = straight
    shutil.rmtree(root / "store")
    shutil.copytree(root / "pristine", root / "store")
    return recipe


def final_weights(recipe) -> dict[str, torch.Tensor]:
    return load_file(Store.from_config(recipe.storage).path(f"runs/{RUN}/04-math_rl/model/model.safetensors"))


def truncate_manifest(store: Store, stage: str) -> None:
    key = f"runs/{RUN}/{stage}/MANIFEST.json"
    store.write_bytes(key, store.read_bytes(key)[:700])


def delete_manifest(store: Store, stage: str) -> None:
    store.delete(f"runs/{RUN}/{stage}/MANIFEST.json")


def flip_model_byte(store: Store, stage: str) -> None:
    key = f"runs/{RUN}/{stage}/model/model.safetensors"
    data = bytearray(store.read_bytes(key))
    data[len(data) // 2] ^= 0x01
    store.write_bytes(key, bytes(data))


@pytest.mark.parametrize(
    "damage, stage",
    [
        (truncate_manifest, "03-if_rl"),
        (delete_manifest, "04-math_rl"),
        (flip_model_byte, "01-sft"),
    ],
)
def test_resume_rebuilds_a_stage_that_does_not_verify(straight, damage, stage):
    recipe = fresh_run(straight)
    store = Store.from_config(recipe.storage)
    damage(store, stage)

    resumed = cascade_flow(recipe, RUN)

    name = stage.split("-", 1)[1]
    entry = resumed.stage(name)
    assert entry.status == "completed" and "did not verify" in entry.rebuilt
    assert all(s.status in ("completed", "skipped") for s in resumed.stages)
    reference = straight[2]
    rebuilt = final_weights(recipe)
    for key in reference:
        torch.testing.assert_close(rebuilt[key], reference[key], rtol=0, atol=1e-6)
    assert gc(store, [RUN], delete=True).unreadable == []
    assert store.exists(f"runs/{RUN}/{stage}/model/model.safetensors")


def test_a_stage_rebuilt_into_another_checkpoint_rebuilds_every_stage_made_from_it(straight, monkeypatch):
    """SFT's model has a flipped byte and no step checkpoint is left, so resume rebuilds it from scratch, and it
    comes out another checkpoint (here under another seed; on another kind of host, by its kernels' rounding).
    Resume says beforehand that what was made from SFT is kept only if SFT comes out as it was; then difficulty and
    if_rl (made from SFT) and math_rl (made from if_rl) are rebuilt, each manifest naming its new parent, and the
    report says why. Before, the three were adopted: the final model descended from the SFT the run no longer held."""
    recipe = fresh_run(straight)
    store = Store.from_config(recipe.storage)
    old_sft = committed(store, f"runs/{RUN}/01-sft").digest
    flip_model_byte(store, "01-sft")
    store.delete(steps_dir(f"runs/{RUN}/01-sft"))
    real_sft = cascade.stages.kinds.sft.run_sft.run_sft

    def elsewhere(cfg, ctx, inputs):
        other = ctx.recipe.model_copy(update={"seed": ctx.recipe.seed + 1})
        return real_sft(cfg, dataclasses.replace(ctx, recipe=other), inputs)

    monkeypatch.setattr(cascade.stages.kinds.sft.run_sft, "run_sft", elsewhere)
    positions = {name: where for name, where, _ in stage_positions(store, RUN, recipe)}
    assert positions["sft"].startswith("rebuilt (its checkpoint did not verify: model/model.safetensors: sha256")
    for name, parent in [("difficulty", "sft"), ("if_rl", "sft"), ("math_rl", "if_rl")]:
        assert positions[name] == f"committed; kept if {parent} comes out as it was, else rebuilt"

    resumed = cascade_flow(recipe, RUN)

    sft = committed(store, f"runs/{RUN}/01-sft").digest
    assert sft != old_sft and "did not verify" in resumed.stage("sft").rebuilt
    for stage, parent in [("02-difficulty", "01-sft"), ("03-if_rl", "01-sft"), ("04-math_rl", "03-if_rl")]:
        name, parent_name = stage.split("-", 1)[1], parent.split("-", 1)[1]
        entry = resumed.stage(name)
        assert entry.status == "completed", (name, entry.status)
        assert entry.rebuilt.startswith(f"its parent {parent_name} changed"), (name, entry.rebuilt)
        manifest = json.loads(store.read_bytes(f"runs/{RUN}/{stage}/MANIFEST.json"))
        assert manifest["parent"]["digest"] == committed(store, f"runs/{RUN}/{parent}").digest, name


def test_gc_keeps_and_lists_a_stage_whose_manifest_does_not_parse(straight):
    recipe = fresh_run(straight)
    store = Store.from_config(recipe.storage)
    truncate_manifest(store, "03-if_rl")
    plan = gc(store, [RUN], delete=True)
    assert plan.unreadable == [f"runs/{RUN}/03-if_rl"]
    assert not [i for i in plan.items if i.key.startswith(f"runs/{RUN}/03-if_rl/")]
    assert store.exists(f"runs/{RUN}/03-if_rl/model/model.safetensors")
    assert f"kept  runs/{RUN}/03-if_rl  (MANIFEST.json does not parse" in plan.render()
