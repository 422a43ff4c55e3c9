"""One import namespace: the wheel installs `cascade` and nothing else at the top of site-packages, and no code of
ours imports a module under its bare folder name (one module under two names is two registries). The installed
wheel runs the README's commands outside the checkout in tests/test_readme.py."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import build_wheel

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("stages", "artifacts", "tasks", "flows", "infra", "sandbox")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_installs_one_top_level_package_holding_every_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"cascade", wheel.name.split("-py")[0] + ".dist-info"}
    shipped = {n for n in names if n.endswith(".py")}
    ours = {
        f"cascade/{p.relative_to(ROOT).as_posix()}"
        for folder in (*FOLDERS, "recipes")
        for p in (ROOT / folder).rglob("*.py")
    }
    assert ours | {"cascade/__init__.py"} == shipped  # a subpackage missing from pyproject's list fails here
    assert {f"cascade/recipes/{p.name}" for p in (ROOT / "recipes").glob("*.yaml")} <= set(names)
    assert "cascade/stages/assets/tokenizer/tokenizer.json" in names
    assert {
        "cascade/stages/assets/nltk_data/LICENSE",
        "cascade/stages/assets/nltk_data/corpora/stopwords.zip",
        "cascade/stages/assets/nltk_data/taggers/averaged_perceptron_tagger_eng.zip",
    } <= set(names)  # IFBench offline
    top_level = next(n for n in names if n.endswith("entry_points.txt"))
    assert "cascade = cascade.flows.cli:main" in zipfile.ZipFile(wheel).read(top_level).decode()


def bare_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else []
        )
        found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in FOLDERS]
    return found


def test_no_file_imports_a_module_under_its_bare_name():
    files = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert files and [hit for f in files for hit in bare_imports(ROOT / f)] == []


def test_the_check_sees_a_bare_import(tmp_path):
    probe = ROOT / "tests" / "_probe_bare_import.py"
    try:
        probe.write_text(
            "def f():\n    from stages.kinds.sft.run_sft import run_sft\n    import cascade.stages.kinds.sft.run_sft\n"
        )
        assert bare_imports(probe) == ["tests/_probe_bare_import.py:2 stages.kinds.sft.run_sft"]
    finally:
        probe.unlink()


IMPORT_EVERYTHING = """
import importlib, pkgutil, sys
import cascade
for folder in {folders}:
    package = importlib.import_module("cascade." + folder)
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
from cascade.stages.domains import DOMAIN_CLASSES, get_domain
from cascade.stages.kinds import KINDS
for name in DOMAIN_CLASSES:
    get_domain(name)
for kind in KINDS.values():
    module, _, function = kind.run.__qualname__.rpartition(".")
    getattr(importlib.import_module(module), function)
from cascade.artifacts.html_template import template_env
template_env().get_template("report.html.j2")  # a package named by string: PackageLoader imports it
print(sorted(n for n in sys.modules if n.split(".")[0] in {folders}))
"""


def test_every_module_and_every_lazy_registry_row_loads_under_the_namespace_alone(tmp_path):
    """Run from outside the checkout: string-named modules (domain classes, kinds' run functions, the report's
    template package) included."""
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING.format(folders=FOLDERS)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"
