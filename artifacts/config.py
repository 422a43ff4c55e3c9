"""Configuration the storage and tracking layers own: where the store and MLflow are, and config hashing.

These sections of a recipe live here, not in `stages/`, so that `artifacts/` never imports `stages/`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator


class Strict(BaseModel):
    """Every config model: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)  # a value may be a secret


def config_hash(cfg: BaseModel) -> str:
    """Stable short hash of a config: part of every checkpoint's provenance and cache key."""
    exclude = set(getattr(cfg, "not_hashed", ()))  # fields a config declares irrelevant to its result
    blob = json.dumps(cfg.model_dump(mode="json", exclude=exclude), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def cascade_home() -> Path:
    return Path(os.environ.get("CASCADE_HOME", "~/.cascade")).expanduser()


STORE_SCHEMES = ("file://", "s3://")


class StorageConfig(Strict):
    root: str | None = None  # None: $CASCADE_STORE, else file://$CASCADE_HOME; or s3://bucket/prefix
    endpoint_url: str | None = None  # None: AWS_ENDPOINT_URL or the AWS default
    region: str | None = None
    profile: str | None = None

    @field_validator("root")
    @classmethod
    def _known_scheme(cls, root: str | None) -> str | None:
        """A store persists checkpoints: file:// (or a local path) and s3:// are what this project tests."""
        if root is not None and "://" in root and not root.startswith(STORE_SCHEMES):
            raise ValueError(f"unsupported store {root.split('://')[0]}://; use file:///path or s3://bucket/prefix")
        return root

    def resolved_root(self) -> str:
        return self.root or os.environ.get("CASCADE_STORE") or f"file://{cascade_home()}"


class TrackingConfig(Strict):
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else a sqlite file under $CASCADE_HOME
    experiment: str = "cascade"
    enabled: bool = True

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{cascade_home() / 'mlflow.db'}"
