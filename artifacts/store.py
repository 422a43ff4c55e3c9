"""Object storage through fsspec: `file://` and `s3://` share one code path.

Keys are '/'-separated paths relative to the store root. Nothing here knows about checkpoints; it moves bytes
and files. Credentials are never accepted as arguments: s3fs reads them from the environment or the standard
AWS config, so they cannot leak into recipes, logs or MLflow params.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fsspec

from stages.recipe import StorageConfig


def storage_options(cfg: StorageConfig) -> dict[str, Any]:
    if not cfg.resolved_root().startswith("s3://"):
        return {}
    opts: dict[str, Any] = {}
    client_kwargs: dict[str, Any] = {}
    if cfg.endpoint_url:
        client_kwargs["endpoint_url"] = cfg.endpoint_url
    if cfg.region:
        client_kwargs["region_name"] = cfg.region
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    if cfg.profile:
        opts["profile"] = cfg.profile
    return opts


class Store:
    def __init__(self, root: str, options: dict[str, Any] | None = None):
        self.fs, path = fsspec.core.url_to_fs(root, **(options or {}))
        self.root = path.rstrip("/")
        self.protocol = root.split("://", 1)[0] if "://" in root else "file"

    @classmethod
    def from_config(cls, cfg: StorageConfig) -> Store:
        return cls(cfg.resolved_root(), storage_options(cfg))

    def path(self, key: str) -> str:
        return f"{self.root}/{key.strip('/')}" if key else self.root

    def uri(self, key: str) -> str:
        return f"{self.protocol}://{self.path(key)}"

    def exists(self, key: str) -> bool:
        return self.fs.exists(self.path(key))

    def read_bytes(self, key: str) -> bytes:
        return self.fs.cat_file(self.path(key))

    def write_bytes(self, key: str, data: bytes) -> None:
        if self.protocol == "file":
            self.fs.makedirs(str(Path(self.path(key)).parent), exist_ok=True)
        self.fs.pipe_file(self.path(key), data)

    def put_file(self, local: str | Path, key: str) -> None:
        if self.protocol == "file":
            self.fs.makedirs(str(Path(self.path(key)).parent), exist_ok=True)
        self.fs.put_file(str(local), self.path(key))

    def get_file(self, key: str, local: str | Path) -> None:
        Path(local).parent.mkdir(parents=True, exist_ok=True)
        self.fs.get_file(self.path(key), str(local))

    def size(self, key: str) -> int:
        return int(self.fs.info(self.path(key))["size"])

    def list(self, prefix: str) -> list[str]:
        """Keys of every file under prefix (recursive), relative to the root."""
        base = self.path(prefix)
        if not self.fs.exists(base):
            return []
        found = self.fs.find(base)
        return sorted(p[len(self.root) + 1 :] for p in found)

    def list_dirs(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        if not self.fs.exists(base):
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False) if self.fs.isdir(p))

    def delete(self, key: str) -> None:
        if self.fs.exists(self.path(key)):
            self.fs.rm(self.path(key), recursive=True)

    def invalidate(self) -> None:
        """Forget cached listings (s3fs caches them) so another writer's objects become visible."""
        self.fs.invalidate_cache()
