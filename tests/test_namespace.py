"""One import namespace: the wheel installs `cascade` and nothing else at the top of site-packages, and no code of
ours imports a module under its bare folder name (one module under two names is two registries)."""

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("stages", "artifacts", "tasks", "flows", "infra", "sandbox")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the checkout's files (setuptools' build/ in the checkout would keep deleted modules),
    with no warning from setuptools about pyproject.toml."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out)]
    build = subprocess.run([*pip, str(source)], check=True, capture_output=True, text=True)
    # setuptools warns of a license table, data folders missing from `packages`, ...: pyproject.toml says it right
    assert "warning" not in (build.stdout + build.stderr).lower(), build.stdout + build.stderr
    (built,) = out.glob("cascade-*.whl")
    return built


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


@pytest.mark.slow
def test_the_installed_wheel_plans_and_runs_a_recipe_outside_the_checkout(wheel, tmp_path, prefect_api):
    """`pip install` of the wheel into a fresh venv, run from a folder outside the checkout: the shipped recipes
    come from the installed package. The venv borrows the test venv's third-party packages through PYTHONPATH
    (no download), which runs no .pth file, so the checkout's editable install cannot answer `import cascade`."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    install = ["--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", "--no-index", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", *install], check=True, capture_output=True)
    third_party = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CASCADE_", "MLFLOW_"))}
    env.update(PYTHONPATH=third_party, CASCADE_HOME=str(tmp_path / "home"), PREFECT_API_URL=prefect_api)
    env.update(OMP_NUM_THREADS="1")
    work = tmp_path / "elsewhere"
    work.mkdir()

    def cascade(*args: str) -> subprocess.CompletedProcess:
        command = [str(venv / "bin" / "cascade"), *args]
        return subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)

    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import cascade.recipes as r; print(r.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
    plan = cascade("plan", "tiny")
    assert plan.returncode == 0 and plan.stdout.startswith("recipe tiny: valid, 5 stages"), plan.stderr[-2000:]
    run = cascade("run", "micro", "--run-id", "wheel")
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    assert "Forgetting matrix" in run.stdout
    assert (tmp_path / "home" / "runs" / "wheel" / "report.json").is_file()
    assert not list(work.iterdir())  # nothing written into the working directory


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
