"""The cascade flow end to end on the micro recipe, under a real (temporary) Prefect server."""

import json
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import cascade.stages.kinds.grpo.run_grpo
import cascade.stages.kinds.sft.run_sft
from cascade.artifacts.checkpoint import committed
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from cascade.flows.cascade import cascade_flow
from cascade.stages.train.precision import first_cpu_fields
from tests.conftest import micro_recipe

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]
GOLDEN_DIGESTS = Path(__file__).with_name("micro_digests.json")


def host_kind() -> str:
    """The torch build and the CPU's vendor: what the micro run's bits depend on (micro_digests.json)."""
    return f"{torch.__version__} {(first_cpu_fields() or {}).get('vendor_id', 'unknown')}"


def final_weights(store: Store, report: RunReport) -> dict[str, torch.Tensor]:
    last = report.stages[-1].checkpoint
    key = last.split(f"{store.root}/", 1)[1]
    return load_file(store.path(f"{key}/model/model.safetensors"))


@pytest.fixture(scope="module")
def straight(prefect_harness, tmp_path_factory):
    """The micro cascade run once, straight through, as run `e2e`: the end-to-end test reads it, and the resume
    tests compare with it. Returns (its directory, the recipe, the flow's report, what its stages left in the
    scratch directory)."""
    tmp = tmp_path_factory.mktemp("straight")
    scratch = tmp / "tmp"
    scratch.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CASCADE_HOME", str(tmp / "cascade-home"))
        patch.setattr(tempfile, "tempdir", str(scratch))
        recipe = micro_recipe(tmp)
        report = cascade_flow(recipe, "e2e")
    return tmp, recipe, report, sorted(p.name for p in scratch.iterdir())


def test_micro_cascade_runs_end_to_end(straight):
    tmp_path, recipe, report, left_in_scratch = straight
    assert left_in_scratch == []  # no stage or eval left a model copy behind
    store = Store.from_config(recipe.storage)
    on_disk = json.loads(store.read_bytes("runs/e2e/report.json"))
    assert [s["name"] for s in on_disk["stages"]] == ["sft_data", "sft", "difficulty", "if_rl", "math_rl"]
    assert all(s["status"] == "completed" for s in on_disk["stages"])
    assert [e["after_stage"] for e in on_disk["evals"]] == ["sft", "if_rl", "math_rl"]
    for e in on_disk["evals"]:
        assert set(e["scores"]) == {
            "math",
            "instruct",
            "greedy/math",
            "greedy/instruct",
            "pass@4/math",
            "pass@4/instruct",
            "dev/math",
            "dev/instruct",
        }
        assert all(0.0 <= v <= 1.0 for v in e["scores"].values())
    grpo = on_disk["stages"][3]["metrics"]
    assert grpo["engine"] == "hf" and grpo["steps"] == 2
    # IF-RL makes real updates (micro's instruct gives partial credit, so groups have signal): the suite guards
    # the RL update
    assert grpo["kept_groups"] > 0
    sft, if_rl = (load_file(store.path(f"runs/e2e/{s}/model/model.safetensors")) for s in ("01-sft", "03-if_rl"))
    assert any(not torch.equal(sft[k], if_rl[k]) for k in sft)
    assert on_disk["stages"][1]["metrics"]["steps"] == 6
    assert report.forgetting_matrix()[0] == [
        "instruct",
        "greedy/instruct",
        "pass@4/instruct",
        "dev/instruct",
        "math",
        "greedy/math",
        "pass@4/math",
        "dev/math",
    ]
    # every stage's checkpoint is an ordinary HF checkpoint transformers loads
    from transformers import AutoModelForCausalLM

    model_dir = store.path("runs/e2e/04-math_rl/model")
    assert AutoModelForCausalLM.from_pretrained(model_dir).num_parameters() > 0
    # the stage driver (no Prefect, no MLflow) makes the flow's SFT checkpoint, bit for bit
    from cascade.stages.run import main as drive

    assert drive(["micro", f"storage.root=file://{tmp_path}/driver", "--stage", "sft_data", "--stage", "sft"]) == 0
    driven = Store.from_config(micro_recipe(tmp_path, f"storage.root=file://{tmp_path}/driver").storage)
    flow_sft, driver_sft = (
        load_file(s.path(f"runs/{run}/01-sft/model/model.safetensors"))
        for s, run in ((store, "e2e"), (driven, "driver"))
    )
    assert flow_sft.keys() == driver_sft.keys() and all(torch.equal(flow_sft[k], driver_sft[k]) for k in flow_sft)
    assert (
        json.loads(store.read_bytes("runs/e2e/01-sft/MANIFEST.json"))["config_hash"]
        == json.loads(driven.read_bytes("runs/driver/01-sft/MANIFEST.json"))["config_hash"]
    )


def test_every_micro_checkpoint_is_the_one_recorded_for_this_kind_of_host(straight):
    """Bit for bit the digests micro_digests.json holds for this torch build and CPU vendor: a change of structure
    moves none. A kind of host with no recorded digests is a skip that names it and prints the digests to record,
    never a pass."""
    _, recipe, report, _ = straight
    store = Store.from_config(recipe.storage)
    recorded = json.loads(GOLDEN_DIGESTS.read_text())["recorded"]
    digests = {s.name: committed(store, f"runs/e2e/{i:02d}-{s.name}").digest for i, s in enumerate(report.stages)}
    kind = host_kind()
    if kind not in recorded:
        pytest.skip(f"no micro digests recorded for {kind!r} (known: {sorted(recorded)}); this host's: {digests}")
    assert digests == recorded[kind]["digests"], f"{kind}: {json.dumps(digests, indent=1)}"


@pytest.mark.parametrize("results_kept, done_status", [(True, "completed"), (False, "skipped")])
def test_resume_after_second_stage_reruns_only_the_rest(straight, tmp_path, monkeypatch, results_kept, done_status):
    """Completed stages come back as Prefect cache hits (their report rows stay `completed`); without the
    persisted results (a kill between checkpoint commit and result write) their manifests skip them."""
    recipe = micro_recipe(tmp_path / "b")
    real_grpo = cascade.stages.kinds.grpo.run_grpo.run_grpo

    def killed(*args, **kwargs):
        raise RuntimeError("simulated preemption")

    monkeypatch.setattr(cascade.stages.kinds.grpo.run_grpo, "run_grpo", killed)
    with pytest.raises(RuntimeError, match="simulated preemption"):
        cascade_flow(recipe, "cut")
    store = Store.from_config(recipe.storage)
    cut = RunReport.load(store, "cut")
    assert [(s.name, s.status) for s in cut.stages] == [
        ("sft_data", "completed"),
        ("sft", "completed"),
        ("difficulty", "completed"),
        ("if_rl", "failed"),
    ]

    if not results_kept:
        store.fs.rm(store.path("runs/cut/prefect-results"), recursive=True)
    calls = []
    monkeypatch.setattr(
        cascade.stages.kinds.grpo.run_grpo, "run_grpo", lambda *a, **k: calls.append(a[0].name) or real_grpo(*a, **k)
    )
    monkeypatch.setattr(cascade.stages.kinds.sft.run_sft, "run_sft", lambda *a, **k: pytest.fail("sft must not re-run"))
    resumed = cascade_flow(recipe, "cut")
    assert calls == ["if_rl", "math_rl"]
    assert [(s.name, s.status) for s in resumed.stages] == [
        ("sft_data", done_status),
        ("sft", done_status),
        ("difficulty", done_status),
        ("if_rl", "completed"),
        ("math_rl", "completed"),
    ]

    _, straight_recipe, reference, _ = straight
    assert resumed.evals == reference.evals
    a = final_weights(Store.from_config(straight_recipe.storage), reference)
    b = final_weights(store, resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-6), name
