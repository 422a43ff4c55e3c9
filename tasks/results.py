"""Where Prefect keeps a run's task results and cache records: beside its checkpoints, in the run's store.

On a file:// store, Prefect's own local file system block. On S3, `RunResults`, a block that reads and writes
through cascade's `Store`, so Prefect's result traffic has the deadlines every other request to the store has
(artifacts/store.py: an operation without a body ends within OPERATION_DEADLINE_S, retries included, and one
with a body within its body deadline). Prefect's remote file system block calls s3fs with no deadline at all: an
endpoint that started to trickle its replies mid-run held a run in Prefect's listing of the results prefix for
over 15 minutes. A read that fails is a missing result to Prefect (it runs the stage, whose own store operations
then fail in one line); a write that fails fails the stage.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from prefect.filesystems import WritableFileSystem
from pydantic import PrivateAttr

from cascade.artifacts import layout
from cascade.artifacts.config import StorageConfig
from cascade.artifacts.store import Store
from cascade.stages.recipe.schema import Recipe


class RunResults(WritableFileSystem):
    """A run's Prefect results under `prefix` in the store `storage` names (a StorageConfig, its root resolved)."""

    _block_type_name = "Cascade run results"
    _block_type_slug = "cascade-run-results"
    _description = "A cascade run's task results in its own store, read and written with the store's deadlines."

    storage: dict[str, Any]
    prefix: str
    _store: Store | None = PrivateAttr(None)

    def _open(self) -> Store:
        if self._store is None:
            self._store = Store.from_config(StorageConfig.model_validate(self.storage))
        return self._store

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:
        return self._open().read_bytes(f"{self.prefix}/{path}")

    def write_path(self, path: str, content: bytes, _sync: bool | None = None) -> str:
        self._open().write_bytes(f"{self.prefix}/{path}", content)
        return path

    async def aread_path(self, path: str) -> bytes:
        return await asyncio.to_thread(self.read_path, path)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return await asyncio.to_thread(self.write_path, path, content)


def result_storage(recipe: Recipe, run_id: str) -> Path | WritableFileSystem:
    """The run's results prefix: a local path (Prefect makes it a LocalFileSystem; an unsaved block it refuses),
    or a saved `RunResults` block, one per store (Prefect reads remote result records back only through a saved
    block)."""
    store = Store.from_config(recipe.storage)
    key = layout.results_key(run_id)
    if store.protocol == "file":
        return Path(store.path(key))
    storage = recipe.storage.model_copy(update={"root": recipe.storage.resolved_root()})
    block = RunResults(storage=storage.model_dump(), prefix=key)
    block.save(f"cascade-results-{hashlib.sha256(store.uri(key).encode()).hexdigest()[:12]}", overwrite=True)
    return block
