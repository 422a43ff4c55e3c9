"""Configuration the storage and tracking layers own: where the store and MLflow are, and config hashing.

These sections of a recipe live here, not in `stages/`, so that `artifacts/` never imports `stages/`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, field_validator

from cascade.artifacts.home import cascade_home
from cascade.artifacts.urls import credential_error


class Strict(BaseModel):
    """Every config model: unknown keys are errors, values are immutable once validated. What its hash
    (`config_hash`) leaves out, a config says in `not_hashed` and `hashed_when_set` (a stage config does)."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)  # a value may be a secret
    not_hashed: ClassVar[frozenset[str]] = frozenset()  # fields irrelevant to its result
    hashed_when_set: ClassVar[frozenset[str]] = frozenset()  # fields hashed only when not None


def hashed_fields(cfg: Strict) -> dict[str, Any]:
    """The fields of a config that its hash covers, as JSON values."""
    dumped = cfg.model_dump(mode="json", exclude=set(cfg.not_hashed))
    return {k: v for k, v in dumped.items() if v is not None or k not in cfg.hashed_when_set}


def config_hash(cfg: Strict) -> str:
    """Stable short hash of a config: part of every checkpoint's provenance and cache key."""
    blob = json.dumps(hashed_fields(cfg), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class SettingError(ValueError):
    """A storage or tracking setting that cannot be used as given (a URL holding credentials, a tracking server
    that does not answer); the CLI prints it as one line, exit code 2."""


def url_from_env(name: str) -> str | None:
    """The URL in environment variable `name`, refused when it holds credentials, as in a recipe: from there it
    would reach error messages, Prefect's database and MLflow. The error names the variable, never the value."""
    value = os.environ.get(name) or None
    if value and (message := credential_error(value, name)):
        raise SettingError(message)
    return value


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
        if root is None:
            return root
        if "://" in root and not root.startswith(STORE_SCHEMES):
            raise ValueError(f"unsupported store {root.split('://')[0]}://; use file:///path or s3://bucket/prefix")
        scheme, _, location = root.rpartition("://")
        if scheme == "s3" and not location.split("/")[0]:
            raise ValueError(f"store {root!r} names no bucket; use s3://bucket/prefix")
        if scheme != "s3" and not location:  # file:// alone would be the working directory
            raise ValueError(f"store {root!r} names no directory; use file:///path")
        if scheme != "s3" and Path(location).exists() and not Path(location).is_dir():
            raise ValueError(f"store {root!r} is not a directory")
        return root

    def resolved_root(self) -> str:
        return self.root or url_from_env("CASCADE_STORE") or f"file://{cascade_home()}"


class TrackingConfig(Strict):
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else a sqlite file under $CASCADE_HOME
    experiment: str = "cascade"
    enabled: bool = True
    required: bool = True  # false: a tracking server that does not answer at start is a warning, the run untracked

    def resolved_uri(self) -> str:
        return self.uri or url_from_env("MLFLOW_TRACKING_URI") or f"sqlite:///{cascade_home() / 'mlflow.db'}"
