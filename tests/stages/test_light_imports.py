"""The stage core imports light: the SFT, GRPO and MOPD stages, the kind registry, the recipe (loaded and
validated), the stage driver and launcher, and what running them needs with a file:// store (store, checkpoints,
step log, context, training, the HF engine, the math and instruct domains) import no third-party package beyond torch,
transformers, pydantic, yaml and fsspec.

Why: the GPU machine that runs stage code has CUDA torch and transformers (with numpy, pyyaml, fsspec, pyarrow,
scipy, jinja2) but not boto3, s3fs, Prefect, MLflow, math-verify or matplotlib; and every torchrun rank imports
the stage core, so each package it skips shortens every rank's start. What a stage or grader needs only at run
time (pyarrow for the SFT shards, math-verify for a math answer that is not the gold string) it imports on first
use.

What is checked is what cascade's own code imports (an import statement or `importlib.import_module` in a cascade
module), not all of sys.modules: transformers loads jinja2 itself, and PIL, scipy, sympy and accelerate (which
loads boto3) where they are installed; packages that are absent it does not load.
"""

import json
import subprocess
import sys

import pytest

# torch, transformers and what transformers imports itself; pydantic and its own packages; yaml; fsspec
ALLOWED = {
    "torch",
    "transformers",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "numpy",
    "regex",
    "packaging",
    "filelock",
    "tqdm",
    "httpx",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_inspection",
    "typing_extensions",
    "yaml",
    "fsspec",
}
# absent from the GPU machine, or slow to import and needed only by some stage, grader or the report
HEAVY = {
    "boto3",
    "botocore",
    "s3transfer",
    "s3fs",
    "aiobotocore",
    "aiohttp",
    "prefect",
    "mlflow",
    "matplotlib",
    "scipy",
    "pyarrow",
    "sympy",
    "math_verify",
    "datasets",
    "nltk",
    "jinja2",
    "PIL",
    "sklearn",
    "pandas",
    "jsonschema",
    "datasketch",
    "if_verifiable",
}
STAGE_CORE = [
    "cascade.stages.kinds.sft.run_sft",
    "cascade.stages.kinds.grpo.run_grpo",
    "cascade.stages.kinds.mopd.run_mopd",
    "cascade.stages.kinds",
    "cascade.stages.recipe.schema",
    "cascade.artifacts.store",
    "cascade.artifacts.checkpoint",
    "cascade.artifacts.steplog",
    "cascade.stages.train.context",
    "cascade.stages.train.training",
    "cascade.stages.engines.hf",
    "cascade.stages.scale.launch",
    "cascade.stages.run",
]

# Notes every third-party top-level package that a cascade module imports, also one that something else loaded
# first (transformers loads yaml and, where installed, boto3 before any cascade module asks for them).
RECORD_CASCADE_IMPORTS = """
import builtins, importlib, json, os, sys

imported = set()
import_statement, import_module = builtins.__import__, importlib.import_module


def note(name, importer):
    package = name.partition(".")[0]
    if importer.partition(".")[0] == "cascade" and package != "cascade" and package not in sys.stdlib_module_names:
        imported.add(package)


def noting_import_statement(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        note(name, (globals or {}).get("__name__", ""))
    return import_statement(name, globals, locals, fromlist, level)


def noting_import_module(name, package=None):
    if not name.startswith("."):
        note(name, sys._getframe(1).f_globals.get("__name__", ""))
    return import_module(name, package)


builtins.__import__, importlib.import_module = noting_import_statement, noting_import_module
"""

RUN_WITH_A_FILE_STORE = """
from cascade.artifacts.config import StorageConfig
from cascade.artifacts.store import Store
from cascade.stages.domains import get_domain

get_domain("math")
get_domain("instruct")
from cascade.stages.recipe.schema import load_recipe

load_recipe("micro", ["compute.device=cpu"])  # validation loads every domain (the benchmark registry)
store = Store.from_config(StorageConfig(root="file://" + os.getcwd() + "/store"))
store.write_bytes("probe", b"light")
assert store.read_bytes("probe") == b"light"
"""


def third_party_imports_of_cascade(modules: list[str], cwd, then: str = "") -> set[str]:
    """In a fresh interpreter, outside the checkout: what cascade's code imports while `modules` are imported and
    `then` runs."""
    script = (
        RECORD_CASCADE_IMPORTS
        + "\nfor module in sys.argv[1:]:\n    importlib.import_module(module)\n"
        + then
        + "\nprint(json.dumps(sorted(imported)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *modules], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.fixture(scope="module")
def stage_core_imports(tmp_path_factory) -> set[str]:
    return third_party_imports_of_cascade(STAGE_CORE, tmp_path_factory.mktemp("light"), then=RUN_WITH_A_FILE_STORE)


def test_the_stage_core_imports_no_heavy_or_server_only_package(stage_core_imports):
    assert "torch" in stage_core_imports
    assert stage_core_imports & HEAVY == set()


def test_the_stage_core_imports_only_what_the_gpu_machine_has(stage_core_imports):
    assert stage_core_imports - ALLOWED == set()


def test_the_check_sees_a_heavy_import(tmp_path):
    """The cascade flow imports Prefect: were the recording broken, the two tests above would pass for nothing."""
    assert "prefect" in third_party_imports_of_cascade(["cascade.flows.cascade"], tmp_path) & HEAVY
