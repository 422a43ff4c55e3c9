"""Where a model source string points: the tiny model, SmolLM2, an HF directory or a committed checkpoint.

Kept apart from `stages.model` so that checking a source imports neither torch nor transformers: `cascade eval
/no/such/model` answers in a second.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from cascade.artifacts.checkpoint import CheckpointRef, committed, materialize
from cascade.artifacts.store import Store
from cascade.stages.config_base import SMOLLM2
from cascade.stages.errors import ModelSourceError


def resolve_model_dir(source: str | Path, workdir: Path) -> Path | None:
    """The one resolver of model sources: a source string -> the local HF directory to load.

    - "tiny": None (the tiny model is built from its config, not loaded);
    - "smollm2-135m": its converted HF checkpoint (converted once, then cached);
    - an HF model directory (one with config.json): itself;
    - a committed checkpoint: a store URI, or a local directory with MANIFEST.json; its files are downloaded
      into a new directory under `workdir`, sha256-verified, and its `model/` directory returned. The caller owns
      `workdir` and removes it: a copy left in /tmp per load fills a disk.
    """
    found = _locate_model(source)
    if not isinstance(found, tuple):
        return found
    store, ref = found
    copy = materialize(store, ref, Path(tempfile.mkdtemp(dir=workdir, prefix="model-")))
    return copy / "model" if (copy / "model").exists() else copy


def check_model_source(source: str | Path) -> None:
    """ModelSourceError for a source that resolve_model_dir would refuse; a checkpoint's manifest is read, its
    files are not downloaded."""
    _locate_model(source)


def _locate_model(source: str | Path) -> Path | tuple[Store, CheckpointRef] | None:
    """None for "tiny", the directory of a local model, or the store and ref of a committed checkpoint."""
    text = str(source)
    if text == "tiny":
        return None
    if text == SMOLLM2:
        from cascade.stages.model import smollm2_dir  # torch and transformers: only when this source is asked for

        return smollm2_dir()
    local = Path(text.removeprefix("file://")).expanduser()
    if "://" not in text.removeprefix("file://") and (local / "config.json").exists():
        return local
    if "://" not in text and not local.exists():
        raise ModelSourceError(f"no such model or checkpoint: {text}")
    store = Store(text if "://" in text else f"file://{local.resolve()}")
    ref = committed(store, "")
    if ref is None:
        raise ModelSourceError(f"{text} is neither an HF model dir nor a committed checkpoint (no valid MANIFEST.json)")
    return store, ref
