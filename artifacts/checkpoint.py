"""Checkpoints: a directory of files in the store plus a MANIFEST.json written last.

A checkpoint exists only when its manifest exists and verifies (file list, sizes, sha256). Object stores have no
atomic rename, so the manifest is the commit point: a writer killed mid-upload leaves files without a manifest,
which nothing adopts (and `artifacts.gc` later deletes).

Writing: files upload in parallel threads; each upload is checked AFTER it lands against what the store really
holds: on s3 the server's ChecksumSHA256 (sent with the upload, so AWS/MinIO validate the received bytes; moto
only stores the header it was given), or, when the server keeps no whole-object hash (multipart uploads, s3rver),
a re-read of the object; on file:// a re-hash of the written file. Transient store errors are retried by the
Store with backoff; a mismatch after upload re-uploads the file once more before failing. Commit guards (the run
lease registers one) run just before the manifest, so a writer that lost its lease never commits.

Loading re-hashes every downloaded file and names the first one that does not match.

Remaining race: two writers of the same key (which the run lease exists to prevent) could interleave files; the
manifest of the later one would then vouch for a mix only if both wrote identical file names and sizes, and the
sha256 check on load still catches any content mismatch.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from cascade.artifacts.layout import MANIFEST, STAGE_DIR, run_dir, step_key, steps_dir
from cascade.artifacts.store import Store
from cascade.artifacts.transfer import sha256_file

UPLOAD_THREADS = 8
VERIFY_ATTEMPTS = 2  # uploads of one file whose stored bytes do not hash right, before giving up

# Called as guard(store, key) just before a manifest is written; raising stops the commit. The run lease
# registers one so that a writer whose lease was taken over cannot commit (see artifacts.lease).
COMMIT_GUARDS: list[Callable[[Store, str], None]] = []


class CheckpointError(RuntimeError):
    pass


class CheckpointRef(BaseModel):
    """What tasks pass around instead of models: where a checkpoint is and what it holds."""

    model_config = ConfigDict(frozen=True)
    uri: str
    key: str
    stage: str
    step: int | None = None
    config_hash: str
    digest: str


def _digest(files: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_checkpoint(
    store: Store,
    key: str,
    local_dir: Path,
    *,
    stage: str,
    step: int | None,
    parent: CheckpointRef | None,
    config_hash: str,
    metrics: dict[str, Any] | None = None,
) -> CheckpointRef:
    """Upload every file under local_dir to key/, in parallel, verify each, then commit with the manifest."""
    local_dir = Path(local_dir)
    paths = sorted(p for p in local_dir.rglob("*") if p.is_file())
    store.delete(f"{key}/{MANIFEST}")  # an older commit at this key must not vouch for the new files
    files = _upload_all(store, key, local_dir, paths)
    manifest = {
        "stage": stage,
        "step": step,
        "config_hash": config_hash,
        "parent": parent.model_dump() if parent else None,
        "files": files,
        "metrics": metrics or {},
        "created": time.time(),
    }
    for guard in list(COMMIT_GUARDS):
        guard(store, key)
    blob = json.dumps(manifest, indent=1).encode()
    store.write_bytes(f"{key}/{MANIFEST}", blob)
    return CheckpointRef(
        uri=store.uri(key), key=key, stage=stage, step=step, config_hash=config_hash, digest=_digest(files)
    )


def _upload_all(store: Store, key: str, local_dir: Path, paths: list[Path]) -> list[dict[str, Any]]:
    """Upload in parallel; on the first failure, cancel what has not started and re-raise it (with a note)."""
    if not paths:
        return []
    pool = ThreadPoolExecutor(min(UPLOAD_THREADS, len(paths)))
    try:
        futures = [pool.submit(_upload, store, key, local_dir, p) for p in paths]
        wait(futures, return_when=FIRST_EXCEPTION)
        for fut, path in zip(futures, paths):
            if fut.done() and fut.exception() is not None:
                err = fut.exception()
                err.add_note(
                    f"cascade: checkpoint {store.uri(key)} not committed: uploading "
                    f"{path.relative_to(local_dir).as_posix()} failed"
                )
                raise err
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # wait: no thread may upload after we report failure


def _upload(store: Store, key: str, local_dir: Path, path: Path) -> dict[str, Any]:
    rel = path.relative_to(local_dir).as_posix()
    size, digest, stored = path.stat().st_size, None, None
    for _ in range(VERIFY_ATTEMPTS):
        sent = store.put_file(path, f"{key}/{rel}")  # the hash of the bytes sent, when it hashed them on the way
        digest = digest or (sent.sha256 if sent else sha256_file(path))
        if sent is not None and sent.verified and sent.sha256 == digest:  # the server's checksum matched already
            stored = digest if store.size(f"{key}/{rel}") == size else None
        else:
            stored = _stored_digest(store, f"{key}/{rel}", size)
        if stored == digest:
            return {"path": rel, "size": size, "sha256": digest}
    raise CheckpointError(
        f"upload of {rel} to {store.uri(key)} does not verify: the store holds "
        f"{stored or 'a different size'}, expected sha256 {digest} ({VERIFY_ATTEMPTS} attempts)"
    )


def _stored_digest(store: Store, key: str, size: int) -> str | None:
    """The sha256 of what the store holds at key (None when even the size is wrong): the server's checksum when
    it keeps a whole-object one (one HEAD), else the bytes read back."""
    stored_size, server_hash = store.stat_sha256(key)
    if stored_size != size:
        return None
    return server_hash or store.sha256(key)


def read_manifest(store: Store, key: str) -> dict[str, Any] | None:
    """The manifest, or None when the checkpoint was never committed."""
    if not store.exists(f"{key}/{MANIFEST}"):
        return None
    try:
        manifest = json.loads(store.read_bytes(f"{key}/{MANIFEST}"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{store.uri(key)}/{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise CheckpointError(f"{store.uri(key)}/{MANIFEST} has no file list")
    return manifest


def committed(store: Store, key: str) -> CheckpointRef | None:
    """The ref of a committed checkpoint whose files are all present with their sizes, else None.

    Cheap (one listing): it catches partial uploads, not flipped bytes; `materialize` and `verify` hash."""
    try:
        manifest = read_manifest(store, key)
    except CheckpointError:
        return None  # a torn or foreign manifest commits nothing
    if manifest is None:
        return None
    sizes = store.sizes(key)
    if any(sizes.get(f["path"]) != f["size"] for f in manifest["files"]):
        return None
    return CheckpointRef(
        uri=store.uri(key),
        key=key,
        stage=manifest["stage"],
        step=manifest["step"],
        config_hash=manifest["config_hash"],
        digest=_digest(manifest["files"]),
    )


def adoptable(store: Store, key: str, config: str | None = None) -> tuple[CheckpointRef | None, list[str]]:
    """Whether the checkpoint at key may be adopted instead of rebuilt: (ref, []) when it is committed and every
    file verifies (list, sizes, sha256) and, with `config`, was written under that config hash; (None, problems)
    when something is there that does not verify (a torn, deleted or rewritten manifest, a flipped byte); (None,
    []) when nothing of a final checkpoint is there, or it was made by another config."""
    problems = damaged(store, key)
    if problems:
        return None, problems
    done = committed(store, key)
    return (done, []) if done is not None and config in (None, done.config_hash) else (None, [])


def committed_steps(store: Store, stage_key: str, config: str | None = None) -> list[int]:
    """The steps of a stage's committed step checkpoints, in order; with `config`, only those written under that
    config hash (the ones a resume of the stage can continue from)."""
    steps = sorted(int(s) for s in store.list_dirs(steps_dir(stage_key)) if s.isdigit())
    refs = {s: committed(store, step_key(stage_key, s)) for s in steps}
    return [s for s, ref in refs.items() if ref is not None and (config is None or ref.config_hash == config)]


def prune_step_checkpoints(store: Store, stage_key: str, keep: int) -> list[int]:
    """Delete all but the newest `keep` committed step checkpoints of a stage while it runs; returns the steps
    deleted. Resume needs only the newest valid one; a long run must not fill the store with the rest."""
    valid = committed_steps(store, stage_key)
    doomed = valid[:-keep] if keep > 0 else valid
    discard_step_checkpoints(store, stage_key, doomed)
    return doomed


def discard_step_checkpoints(store: Store, stage_key: str, steps: list[int]) -> None:
    for step in steps:
        store.delete(f"{step_key(stage_key, step)}/{MANIFEST}")  # uncommit first: a crash leaves an orphan
        store.delete(step_key(stage_key, step))


def verify(store: Store, key: str, hashes: bool = True) -> list[str]:
    """Problems with the checkpoint at key, hashing what the store holds (no download to disk); [] = valid.
    hashes=False checks the manifest and every file's size only: one listing, for `cascade status`."""
    try:
        manifest = read_manifest(store, key)
    except CheckpointError as e:
        return [str(e)]
    if manifest is None:
        return [f"{store.uri(key)} has no {MANIFEST}"]
    sizes = store.sizes(key)
    problems = []
    for f in manifest["files"]:
        if sizes.get(f["path"]) != f["size"]:
            problems.append(f"{f['path']}: size {sizes.get(f['path'])} != {f['size']}")
        elif hashes and store.sha256(f"{key}/{f['path']}") != f["sha256"]:
            problems.append(f"{f['path']}: sha256 does not match {MANIFEST}")
    return problems


def damaged(store: Store, key: str, hashes: bool = True) -> list[str]:
    """What is wrong with a stage's checkpoint at key: [] when it verifies or was never committed (nothing but
    step checkpoints there: a stage to run or resume, not a damaged one)."""
    if not store.exists(f"{key}/{MANIFEST}") and not any(not p.startswith("steps/") for p in store.sizes(key)):
        return []
    return verify(store, key, hashes)


def verify_run(store: Store, run_id: str) -> dict[str, list[str]]:
    """Every checkpoint of a run, every file hashed against its manifest: checkpoint key -> its problems, for
    each stage directory and each of its committed step checkpoints that does not verify."""
    found: dict[str, list[str]] = {}
    for stage in store.list_dirs(run_dir(run_id)):
        key = f"{run_dir(run_id)}/{stage}"
        if not STAGE_DIR.fullmatch(stage):
            continue  # metrics/, prefect-results/: no checkpoint
        keys = [key] + [step_key(key, int(n)) for n in store.list_dirs(steps_dir(key)) if n.isdigit()]
        for checkpoint in keys:
            if problems := damaged(store, checkpoint):
                found[checkpoint] = problems
    return found


def materialize(store: Store, ref: CheckpointRef, dest: Path) -> Path:
    """Download the checkpoint into dest in parallel, verifying every file against the manifest's sha256."""
    manifest = read_manifest(store, ref.key)
    if manifest is None:
        raise CheckpointError(f"checkpoint {ref.uri} has no {MANIFEST}")
    if _digest(manifest["files"]) != ref.digest:
        raise CheckpointError(f"checkpoint {ref.uri} was rewritten since it was referenced (digest changed)")
    dest = Path(dest)

    def fetch(f: dict[str, Any]) -> str | None:
        local = dest / f["path"]
        got = store.get_file(f"{ref.key}/{f['path']}", local)  # hashed on the way, when it can
        return None if (got or sha256_file(local)) == f["sha256"] else f["path"]

    with ThreadPoolExecutor(min(UPLOAD_THREADS, max(1, len(manifest["files"])))) as pool:
        bad = [p for p in pool.map(fetch, manifest["files"]) if p is not None]
    if bad:
        raise CheckpointError(
            f"checkpoint {ref.uri}: {bad[0]} does not match its sha256 in {MANIFEST}"
            + (f" (and {len(bad) - 1} more file(s))" if len(bad) > 1 else "")
        )
    return dest
