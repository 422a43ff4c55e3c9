"""What a regression eval given no recipe evaluates: the finished run whose final policy was committed last, with
its own recipe; failed runs, runs without an evaluated checkpoint and torn reports are passed over."""

import json

from cascade.artifacts.config import StorageConfig
from cascade.artifacts.store import Store
from cascade.stages.evals.regression import newest_finished_run


def _run(store: Store, run_id: str, status: str, created: float | None, evals=("source", "sft", "rl")) -> None:
    stages = [
        {"name": s, "kind": kind, "status": "completed", "checkpoint": store.uri(f"runs/{run_id}/{i:02d}-{s}")}
        for i, (s, kind) in enumerate((("sft", "sft"), ("rl", "grpo")))
    ]
    report = {
        "run_id": run_id,
        "recipe": "micro",
        "stages": stages,
        "evals": [{"after_stage": e, "scores": {}} for e in evals],
        "status": status,
    }
    store.write_bytes(f"runs/{run_id}/report.json", json.dumps(report).encode())
    store.write_bytes(f"runs/{run_id}/recipe.json", b"{}")
    if created is not None:
        for i, s in enumerate(("sft", "rl")):
            manifest = {"files": [], "created": created + i}
            store.write_bytes(f"runs/{run_id}/{i:02d}-{s}/MANIFEST.json", json.dumps(manifest).encode())


def test_the_newest_finished_runs_final_checkpoint_and_recipe(tmp_path):
    store = Store.from_config(StorageConfig(root=f"file://{tmp_path}"))
    assert newest_finished_run(store) is None
    _run(store, "old", "FINISHED", created=100.0)
    _run(store, "failed", "FAILED", created=300.0)  # newer, but it did not finish
    _run(store, "uncommitted", "FINISHED", created=None)  # its final checkpoint has no manifest
    _run(store, "newer", "FINISHED", created=200.0, evals=("sft",))  # its last eval is after sft
    store.write_bytes("runs/torn/report.json", b'{"run_id": "torn"')
    run = newest_finished_run(store)
    assert (run.run_id, run.created) == ("newer", 200.0)
    assert run.checkpoint == store.uri("runs/newer/00-sft") and run.recipe_uri == store.uri("runs/newer/recipe.json")
    _run(store, "newest", "FINISHED", created=250.0)
    run = newest_finished_run(store)
    assert (run.run_id, run.checkpoint, run.created) == ("newest", store.uri("runs/newest/01-rl"), 251.0)


def test_a_run_whose_manifest_has_no_creation_time_is_passed_over_with_one_warning(tmp_path, caplog):
    """A manifest with `created` a string, or without it, stopped the scheduled eval (TypeError, KeyError 'created')."""
    store = Store.from_config(StorageConfig(root=f"file://{tmp_path}"))
    _run(store, "good", "FINISHED", created=100.0)
    for run_id, manifest in (("text", b'{"files": [], "created": "yesterday"}'), ("none", b'{"files": []}')):
        _run(store, run_id, "FINISHED", created=None)
        store.write_bytes(f"runs/{run_id}/01-rl/MANIFEST.json", manifest)
    _run(store, "torn", "FINISHED", created=None)
    store.write_bytes("runs/torn/01-rl/MANIFEST.json", b'{"files": [], "crea')
    with caplog.at_level("WARNING", logger="cascade.regression"):
        run = newest_finished_run(store)
    assert run.run_id == "good"
    lines = sorted(r.getMessage() for r in caplog.records)
    manifest = store.uri("runs/{}/01-rl/MANIFEST.json")
    assert lines == [
        f"run none passed over: {manifest.format('none')} has no 'created' time (it holds None)",
        f"run text passed over: {manifest.format('text')} has no 'created' time (it holds 'yesterday')",
        f"run torn passed over: {manifest.format('torn')} is not valid JSON",
    ]
