"""Where cascade keeps its local state: `$CASCADE_HOME`, default `~/.cascade` (caches, the embedded Prefect and
MLflow databases, torch's compile cache). Standard library only: the `cascade` package reads it when imported,
before any command has loaded pydantic."""

from __future__ import annotations

import os
from pathlib import Path


def cascade_home() -> Path:
    return Path(os.environ.get("CASCADE_HOME", "~/.cascade")).expanduser()
