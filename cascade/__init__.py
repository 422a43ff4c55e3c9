"""Cascade: a Prefect-orchestrated post-training pipeline after NVIDIA's Nemotron-Cascade recipe.

The code lives in the checkout's top-level folders (flows/, tasks/, stages/, artifacts/, infra/, sandbox/), and
each installs as a subpackage of this one: `cascade.stages`, `cascade.flows`, ... (pyproject.toml's
package-dir). Nothing else of ours lands at the top of site-packages.
"""

from pathlib import Path as _Path

# A checkout that is not installed (a device machine that gets the tree alone, `PYTHONPATH=.`): the folders
# beside this one are the subpackages. An installed wheel has them inside this folder and no pyproject.toml.
_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "stages" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))

# torch makes its compile cache directory when torch._dynamo is imported (transformers imports it), by default
# `torchinductor_<user>` in the temp directory: every command left one there. It belongs with our other state.
import os as _os

from cascade.artifacts.home import cascade_home as _cascade_home

_os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_cascade_home() / "torchinductor"))
