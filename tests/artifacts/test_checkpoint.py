"""Checkpoints commit with the manifest last; partial or corrupted ones are never adopted."""

import json

import pytest

from artifacts.checkpoint import MANIFEST, CheckpointError, committed, materialize, write_checkpoint
from artifacts.store import Store


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path}/store")


@pytest.fixture
def local_dir(tmp_path):
    d = tmp_path / "ckpt"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(bytes(range(256)) * 100)
    (d / "state.pt").write_bytes(b"optimizer")
    return d


def test_write_then_commit_then_materialize(store, local_dir, tmp_path):
    ref = write_checkpoint(store, "runs/r/01-sft", local_dir, stage="sft", step=5, parent=None,
                           config_hash="abc", metrics={"loss": 1.5})
    assert ref.uri == store.uri("runs/r/01-sft") and ref.step == 5
    manifest = json.loads(store.read_bytes(f"runs/r/01-sft/{MANIFEST}"))
    assert sorted(f["path"] for f in manifest["files"]) == ["model/weights.bin", "state.pt"]
    assert manifest["metrics"] == {"loss": 1.5} and manifest["config_hash"] == "abc"
    assert committed(store, "runs/r/01-sft") == ref
    out = materialize(store, ref, tmp_path / "out")
    assert (out / "model" / "weights.bin").read_bytes() == (local_dir / "model" / "weights.bin").read_bytes()


def test_manifest_is_written_last(store, local_dir, monkeypatch):
    order = []
    real_put, real_write = store.put_file, store.write_bytes
    monkeypatch.setattr(store, "put_file", lambda local, key: order.append(key) or real_put(local, key))
    monkeypatch.setattr(store, "write_bytes", lambda key, data: order.append(key) or real_write(key, data))
    write_checkpoint(store, "k", local_dir, stage="s", step=None, parent=None, config_hash="h")
    assert order[-1] == f"k/{MANIFEST}" and len(order) == 3


def test_upload_cut_off_leaves_no_checkpoint(store, local_dir, monkeypatch):
    calls = []

    def dying_put(local, key):
        calls.append(key)
        raise ConnectionError("connection reset mid-upload")

    monkeypatch.setattr(store, "put_file", dying_put)
    with pytest.raises(ConnectionError):
        write_checkpoint(store, "k", local_dir, stage="s", step=None, parent=None, config_hash="h")
    assert calls and not store.exists(f"k/{MANIFEST}")
    assert committed(store, "k") is None


def test_missing_or_truncated_file_is_not_committed(store, local_dir):
    write_checkpoint(store, "k", local_dir, stage="s", step=None, parent=None, config_hash="h")
    store.write_bytes("k/state.pt", b"opt")  # truncated
    assert committed(store, "k") is None
    store.delete("k/state.pt")
    assert committed(store, "k") is None


def test_flipped_byte_is_detected_on_load_naming_the_file(store, local_dir, tmp_path):
    ref = write_checkpoint(store, "k", local_dir, stage="s", step=None, parent=None, config_hash="h")
    data = bytearray(store.read_bytes("k/model/weights.bin"))
    data[1000] ^= 0xFF
    store.write_bytes("k/model/weights.bin", bytes(data))
    assert committed(store, "k") == ref  # same size: only the hash can tell
    with pytest.raises(CheckpointError, match=r"model/weights.bin does not match its sha256"):
        materialize(store, ref, tmp_path / "out")


def test_rewriting_a_key_invalidates_the_old_commit_first(store, local_dir, monkeypatch):
    write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    (local_dir / "state.pt").write_bytes(b"newer optimizer state")
    monkeypatch.setattr(store, "put_file", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_checkpoint(store, "k", local_dir, stage="s", step=2, parent=None, config_hash="h")
    assert committed(store, "k") is None
