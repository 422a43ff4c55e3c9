"""gc: orphaned partial uploads go, the last K step checkpoints per stage stay, leased runs are left alone."""

import os

import pytest

from cascade.artifacts.checkpoint import MANIFEST, committed, write_checkpoint
from cascade.artifacts.gc import gc, plan_gc
from cascade.artifacts.lease import Lease


@pytest.fixture
def store(any_store):
    return any_store


def ckpt(store, tmp_path, key, step=None):
    d = tmp_path / f"src-{key.replace('/', '_')}"
    (d / "model").mkdir(parents=True)
    (d / "model" / "w.bin").write_bytes(b"w" * 100)
    return write_checkpoint(store, key, d, stage="sft", step=step, parent=None, config_hash="h")


def build_run(store, tmp_path, run="r"):
    """Steps 1-4 committed, step 5 cut off mid-upload, the stage checkpoint itself cut off too."""
    for step in (1, 2, 3, 4):
        ckpt(store, tmp_path, f"runs/{run}/01-sft/steps/{step}", step)
    store.write_bytes(f"runs/{run}/01-sft/steps/5/model/w.bin", b"w" * 40)  # no manifest
    store.write_bytes(f"runs/{run}/01-sft/model/w.bin", b"w" * 40)
    ckpt(store, tmp_path, f"runs/{run}/00-sft_data")
    store.write_bytes(f"runs/{run}/recipe.json", b"{}")
    store.write_bytes(f"runs/{run}/report.json", b"{}")


def test_plan_lists_orphans_and_old_steps_and_deletes_nothing(store, tmp_path):
    build_run(store, tmp_path)
    plan = plan_gc(store, keep_last=2)
    assert {i.key for i in plan.orphans} == {"runs/r/01-sft/steps/5", "runs/r/01-sft/model"}
    assert {i.key for i in plan.pruned} == {"runs/r/01-sft/steps/1", "runs/r/01-sft/steps/2"}
    assert plan.kept == ["runs/r/01-sft/steps/3", "runs/r/01-sft/steps/4"]
    assert plan.total_bytes == sum(sum(store.sizes(i.key).values()) for i in plan.items) > 40 + 40 + 2 * 100
    text = plan.render()
    assert "would delete  runs/r/01-sft/steps/5" in text and "run again with --yes" in text
    assert store.exists("runs/r/01-sft/steps/5/model/w.bin") and store.exists("runs/r/01-sft/steps/1/model/w.bin")


def test_delete_removes_exactly_the_plan(store, tmp_path):
    build_run(store, tmp_path)
    plan = gc(store, keep_last=2, delete=True)
    assert plan.deleted and "deleted  runs/r/01-sft/steps/1" in plan.render()
    assert store.list_dirs("runs/r/01-sft/steps") == ["3", "4"]
    assert committed(store, "runs/r/01-sft/steps/4") and committed(store, "runs/r/00-sft_data")
    assert not store.exists("runs/r/01-sft/model/w.bin")
    assert store.exists("runs/r/recipe.json") and store.exists("runs/r/report.json")
    assert plan_gc(store, keep_last=2).items == []  # idempotent


def test_leased_runs_are_skipped(store, tmp_path):
    build_run(store, tmp_path, "busy")
    build_run(store, tmp_path / "idle", "idle")
    with Lease(store, "busy", settle=0.01):
        plan = gc(store, keep_last=1, delete=True)
    assert all(i.key.startswith("runs/idle/") for i in plan.items)
    assert plan.skipped and plan.skipped[0].startswith("busy: leased by host")
    assert store.exists("runs/busy/01-sft/steps/5/model/w.bin")
    assert store.list_dirs("runs/idle/01-sft/steps") == ["4"]


def test_a_torn_manifest_is_kept_and_listed_not_deleted(store, tmp_path):
    """Its files may be all there is of that step: gc lists it for a person, and never deletes it."""
    ckpt(store, tmp_path, "runs/r/01-sft/steps/7", 7)
    store.write_bytes(f"runs/r/01-sft/steps/7/{MANIFEST}", b'{"files": [')
    plan = gc(store, delete=True)
    assert plan.items == [] and plan.unreadable == ["runs/r/01-sft/steps/7"]
    assert store.exists("runs/r/01-sft/steps/7/model/w.bin")


def test_keep_last_must_leave_resume_something(store):
    with pytest.raises(ValueError):
        plan_gc(store, keep_last=0)


@pytest.mark.timeout(30)  # a FIFO opened as a file waits for a writer forever
def test_gc_local_keeps_a_scratch_dir_whose_owner_file_is_not_a_file_and_never_hangs(tmp_path):
    from cascade.artifacts.scratch import OWNER, PREFIX, gc_local

    as_dir, as_fifo, orphan = (tmp_path / f"{PREFIX}{name}" for name in ("dir", "fifo", "orphan"))
    for path in (as_dir, as_fifo, orphan):
        path.mkdir()
    (as_dir / OWNER).mkdir()
    os.mkfifo(as_fifo / OWNER)
    (orphan / OWNER).write_text("123456")  # a regular owner file that no process holds a lock on
    plan = gc_local(delete=True, tmp=tmp_path)
    assert sorted(plan.unknown) == [as_dir, as_fifo]
    assert [path for path, _, _ in plan.unowned] == [orphan]
    assert as_dir.exists() and as_fifo.exists() and not orphan.exists()


def test_a_cut_off_data_build_keeps_its_committed_shards(store, tmp_path):
    """kill -9 during the SFT data build: shard 0 committed (its own manifest), shard 1 cut off, no stage manifest."""
    ckpt(store, tmp_path, "runs/d/00-sft_data/shards/00000")
    store.write_bytes("runs/d/00-sft_data/shards/00001/rows.parquet", b"r" * 30)  # no manifest
    store.write_bytes("runs/d/00-sft_data/card.json", b"{}")  # a stage file written before the stage commits
    plan = gc(store, delete=True)
    assert {i.key for i in plan.orphans} == {"runs/d/00-sft_data/shards/00001", "runs/d/00-sft_data/card.json"}
    assert committed(store, "runs/d/00-sft_data/shards/00000") is not None  # never deleted
    assert not store.exists("runs/d/00-sft_data/shards/00001/rows.parquet")


def test_temp_files_of_cut_off_writes_go_even_inside_committed_checkpoints(store, tmp_path):
    build_run(store, tmp_path)
    inside = "runs/r/00-sft_data/model/.w.bin.tmp-4242-0badf00d"  # a committed checkpoint's folder
    store.write_bytes(inside, b"t" * 7)
    store.write_bytes("runs/r/evals/.00-sft.json.tmp-17-deadbeef", b"t" * 3)
    store.write_bytes("runs/r/evals/.notes.tmp", b"kept")  # not the writer's pattern
    plan = gc(store, keep_last=2, delete=True)
    temp = {i.key for i in plan.orphans if "temporary" in i.reason}
    assert temp == {inside, "runs/r/evals/.00-sft.json.tmp-17-deadbeef"}
    assert not store.exists(inside) and store.exists("runs/r/evals/.notes.tmp")
    assert committed(store, "runs/r/00-sft_data") is not None  # the checkpoint itself is untouched
