"""Checkpoints: a directory of files in the store plus a MANIFEST.json written last.

A checkpoint exists only when its manifest exists and verifies (file list, sizes, sha256). Object stores have no
atomic rename, so the manifest is the commit point: a writer killed mid-upload leaves files without a manifest,
which nothing adopts. Loading re-hashes every file and names the first one that does not match.
"""

from __future__ import annotations

import hashlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from artifacts.store import Store

MANIFEST = "MANIFEST.json"
UPLOAD_THREADS = 8


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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    """Upload every file under local_dir to key/, in parallel, then commit with the manifest."""
    local_dir = Path(local_dir)
    paths = sorted(p for p in local_dir.rglob("*") if p.is_file())
    store.delete(f"{key}/{MANIFEST}")  # an older commit at this key must not vouch for the new files
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        files = list(pool.map(lambda p: _upload(store, key, local_dir, p), paths))
    manifest = {
        "stage": stage,
        "step": step,
        "config_hash": config_hash,
        "parent": parent.model_dump() if parent else None,
        "files": files,
        "metrics": metrics or {},
        "created": time.time(),
    }
    store.write_bytes(f"{key}/{MANIFEST}", json.dumps(manifest, indent=1).encode())
    return CheckpointRef(uri=store.uri(key), key=key, stage=stage, step=step, config_hash=config_hash, digest=_digest(files))


def _upload(store: Store, key: str, local_dir: Path, path: Path) -> dict[str, Any]:
    rel = path.relative_to(local_dir).as_posix()
    store.put_file(path, f"{key}/{rel}")
    size = path.stat().st_size
    if store.size(f"{key}/{rel}") != size:
        raise CheckpointError(f"upload of {rel} to {store.uri(key)} is incomplete")
    return {"path": rel, "size": size, "sha256": sha256_file(path)}


def read_manifest(store: Store, key: str) -> dict[str, Any] | None:
    """The manifest, or None when the checkpoint was never committed."""
    if not store.exists(f"{key}/{MANIFEST}"):
        return None
    try:
        return json.loads(store.read_bytes(f"{key}/{MANIFEST}"))
    except json.JSONDecodeError:
        raise CheckpointError(f"{store.uri(key)}/{MANIFEST} is not valid JSON") from None


def committed(store: Store, key: str) -> CheckpointRef | None:
    """The ref of a committed checkpoint whose files are all present with their sizes, else None."""
    manifest = read_manifest(store, key)
    if manifest is None:
        return None
    for f in manifest["files"]:
        rel = f"{key}/{f['path']}"
        if not store.exists(rel) or store.size(rel) != f["size"]:
            return None
    return CheckpointRef(
        uri=store.uri(key),
        key=key,
        stage=manifest["stage"],
        step=manifest["step"],
        config_hash=manifest["config_hash"],
        digest=_digest(manifest["files"]),
    )


def materialize(store: Store, ref: CheckpointRef, dest: Path) -> Path:
    """Download the checkpoint into dest, verifying every file against the manifest's sha256."""
    manifest = read_manifest(store, ref.key)
    if manifest is None:
        raise CheckpointError(f"checkpoint {ref.uri} has no {MANIFEST}")
    if _digest(manifest["files"]) != ref.digest:
        raise CheckpointError(f"checkpoint {ref.uri} was rewritten since it was referenced (digest changed)")
    dest = Path(dest)
    for f in manifest["files"]:
        local = dest / f["path"]
        store.get_file(f"{ref.key}/{f['path']}", local)
        if sha256_file(local) != f["sha256"]:
            raise CheckpointError(f"checkpoint {ref.uri}: {f['path']} does not match its sha256 in {MANIFEST}")
    return dest
