"""A committed stage whose checkpoint no longer verifies is rebuilt on resume, never adopted, and gc never deletes
what it cannot parse.

One micro run is made once; each case restores its store in place, damages one stage (a truncated manifest, a
deleted manifest, a flipped byte in the model), resumes, and must reach the straight run's final weights with the
damaged stage marked `rebuilt` in the report. Before the fix, resume adopted the damaged stage (Prefect's cached
result names it), and gc then deleted the model as orphaned.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.gc import gc
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
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


def test_gc_keeps_and_lists_a_stage_whose_manifest_does_not_parse(straight):
    recipe = fresh_run(straight)
    store = Store.from_config(recipe.storage)
    truncate_manifest(store, "03-if_rl")
    plan = gc(store, [RUN], delete=True)
    assert plan.unreadable == [f"runs/{RUN}/03-if_rl"]
    assert not [i for i in plan.items if i.key.startswith(f"runs/{RUN}/03-if_rl/")]
    assert store.exists(f"runs/{RUN}/03-if_rl/model/model.safetensors")
    assert f"kept  runs/{RUN}/03-if_rl  (MANIFEST.json does not parse" in plan.render()
