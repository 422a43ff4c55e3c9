"""Checkpoints commit with the manifest last; partial or corrupted ones are never adopted.

Every test here runs on file:// and on s3:// (a real moto server): see conftest.py's `any_store`."""

import json

import pytest

from cascade.artifacts.checkpoint import MANIFEST, CheckpointError, committed, materialize, verify, write_checkpoint


@pytest.fixture
def store(any_store):
    return any_store


@pytest.fixture
def local_dir(tmp_path):
    d = tmp_path / "ckpt"
    (d / "model").mkdir(parents=True)
    (d / "model" / "weights.bin").write_bytes(bytes(range(256)) * 100)
    (d / "state.pt").write_bytes(b"optimizer")
    return d


def test_write_then_commit_then_materialize(store, local_dir, tmp_path):
    ref = write_checkpoint(
        store, "runs/r/01-sft", local_dir, stage="sft", step=5, parent=None, config_hash="abc", metrics={"loss": 1.5}
    )
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


# --- verification after upload, retries, torn manifests (added with the s3 backend) ---


def transient_error():
    """What a stopped S3 server really raises: botocore's EndpointConnectionError, which is not an OSError."""
    from botocore.exceptions import EndpointConnectionError

    return EndpointConnectionError(endpoint_url="http://127.0.0.1:1/bucket/key")


def fail_uploads(store, monkeypatch, make_error, times=10**9) -> list:
    """Make the first `times` raw uploads under the Store's retry layer raise make_error(); returns the calls."""
    import cascade.artifacts.store

    calls = []
    if store.protocol == "file":
        real_copy = cascade.artifacts.store.copy_hashing

        def copy(src, dst, atomic):
            if atomic:  # uploads are atomic copies; downloads are not
                calls.append(str(dst))
                if len(calls) <= times:
                    raise make_error()
            return real_copy(src, dst, atomic)

        monkeypatch.setattr(cascade.artifacts.store, "copy_hashing", copy)
    else:
        real_call = store.fs.call_s3

        def call_s3(method, *args, **kwargs):
            if method == "put_object":
                calls.append(kwargs["Key"])
                if len(calls) <= times:
                    raise make_error()
            return real_call(method, *args, **kwargs)

        monkeypatch.setattr(store.fs, "call_s3", call_s3)
    return calls


def test_transient_upload_errors_are_retried_then_committed(store, local_dir, monkeypatch):
    calls = fail_uploads(store, monkeypatch, transient_error, times=2)
    ref = write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert len(calls) == 4 and committed(store, "k") == ref  # 2 files, 2 failed attempts


def test_retries_give_up_with_the_real_error_and_no_manifest(store, local_dir, monkeypatch):
    from botocore.exceptions import EndpointConnectionError

    from cascade.artifacts.store import StoreFailed

    fail_uploads(store, monkeypatch, transient_error)
    with pytest.raises((StoreFailed, EndpointConnectionError)) as info:  # S3 says which endpoint failed
        write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    real = info.value.__cause__ if isinstance(info.value, StoreFailed) else info.value
    assert isinstance(real, EndpointConnectionError)  # the real error, kept and named
    said = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "failed after 3 attempts" in said and "not committed" in said
    store.invalidate()  # the failure was simulated: look again, as a resumed run's fresh process does
    assert not store.exists(f"k/{MANIFEST}") and committed(store, "k") is None


def test_a_permanent_error_is_not_retried(store, local_dir, monkeypatch):
    calls = fail_uploads(store, monkeypatch, lambda: PermissionError("AccessDenied"))
    with pytest.raises(PermissionError):
        write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert len(calls) <= 2  # one per file at most (two files, parallel): never retried


def test_bytes_damaged_on_the_way_are_caught_after_upload_and_reuploaded(store, local_dir, monkeypatch):
    """The store ends up holding other bytes than were sent: the check after upload sees it and uploads again."""
    real, damaged = store.put_file, []

    def damaging(local, key):
        real(local, key)
        if key.endswith("weights.bin") and not damaged:
            damaged.append(key)
            data = bytearray(store.read_bytes(key))
            data[7] ^= 1
            store.write_bytes(key, bytes(data))  # same size: only a hash of what is stored can tell

    monkeypatch.setattr(store, "put_file", damaging)
    store.verify_by_reread = True  # moto echoes the checksum header it is sent: make the check re-read
    ref = write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert damaged and verify(store, "k") == [] and committed(store, "k") == ref


def test_bytes_that_never_verify_fail_the_write_naming_the_file(store, local_dir, monkeypatch):
    real = store.put_file

    def always_damaging(local, key):
        real(local, key)
        if key.endswith("state.pt"):
            store.write_bytes(key, b"optimizex")

    monkeypatch.setattr(store, "put_file", always_damaging)
    store.verify_by_reread = True
    with pytest.raises(CheckpointError, match=r"upload of state.pt .* does not verify"):
        write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert committed(store, "k") is None


def test_s3_uploads_carry_a_sha256_the_server_keeps(store, local_dir):
    ref = write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    manifest = json.loads(store.read_bytes(f"k/{MANIFEST}"))
    for f in manifest["files"]:
        expected = f["sha256"] if store.protocol == "s3" else None
        assert store.stat_sha256(f"k/{f['path']}") == (f["size"], expected)
        assert store.sha256(f"k/{f['path']}") == f["sha256"]
    assert ref.digest


def test_torn_or_foreign_manifest_commits_nothing(store, local_dir):
    write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    store.write_bytes(f"k/{MANIFEST}", b'{"stage": "s", "fil')
    assert committed(store, "k") is None
    assert "not valid JSON" in verify(store, "k")[0]
    store.write_bytes(f"k/{MANIFEST}", b'["not", "a", "manifest"]')
    assert committed(store, "k") is None


def test_verify_hashes_what_the_store_holds(store, local_dir):
    write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert verify(store, "k") == []
    store.write_bytes("k/state.pt", b"optimizeR")
    assert verify(store, "k") == [f"state.pt: sha256 does not match {MANIFEST}"]
    assert verify(store, "nothing") == [f"{store.uri('nothing')} has no {MANIFEST}"]


def test_commit_guard_can_stop_the_manifest(store, local_dir, monkeypatch):
    from cascade.artifacts import checkpoint

    def refuse(st, key):
        raise RuntimeError(f"not the writer of {key}")

    monkeypatch.setattr(checkpoint, "COMMIT_GUARDS", [refuse])
    with pytest.raises(RuntimeError, match="not the writer of k"):
        write_checkpoint(store, "k", local_dir, stage="s", step=1, parent=None, config_hash="h")
    assert not store.exists(f"k/{MANIFEST}")


def test_many_files_upload_and_download_in_parallel(store, tmp_path):
    src = tmp_path / "many"
    for i in range(20):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    ref = write_checkpoint(store, "many", src, stage="s", step=None, parent=None, config_hash="h")
    out = materialize(store, ref, tmp_path / "out")
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == sorted(
        p.relative_to(src) for p in src.rglob("*") if p.is_file()
    )


def test_large_files_go_multipart_with_a_checksum_per_part(store, tmp_path, monkeypatch):
    """Above the multipart threshold: parallel parts, each with its SHA-256; the server's composite checksum of
    the assembled object is compared with ours, so no re-read is needed."""
    if store.protocol != "s3":
        pytest.skip("multipart uploads are an S3 thing")
    store.multipart_threshold, store.part_size = 1 << 20, 5 << 20  # S3's smallest part
    src = tmp_path / "big"
    src.mkdir()
    (src / "shard.bin").write_bytes(bytes(range(256)) * (11 * 4096))  # 11 MiB: parts of 5, 5, 1 MiB
    sent = store.put_file(src / "shard.bin", "direct/shard.bin")
    assert sent.verified and store.stat_checksum("direct/shard.bin")[1]
    monkeypatch.setattr(store, "sha256", lambda key: pytest.fail(f"re-read {key}: the composite should do"))
    ref = write_checkpoint(store, "big", src, stage="s", step=None, parent=None, config_hash="h")
    monkeypatch.undo()
    assert verify(store, "big") == [] and materialize(store, ref, tmp_path / "out")
    assert (tmp_path / "out" / "shard.bin").read_bytes() == (src / "shard.bin").read_bytes()
