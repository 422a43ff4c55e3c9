"""Layering, strictly one way: flows -> tasks -> stages, tasks -> artifacts; stages never see Prefect or MLflow."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(package: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    "package, forbidden",
    [
        ("stages", {"prefect", "mlflow", "tasks", "flows"}),
        ("artifacts", {"prefect", "tasks", "flows"}),
        ("tasks", {"flows"}),
    ],
)
def test_no_upward_imports(package, forbidden):
    offenders = {f: sorted(names & forbidden) for f, names in imported_modules(package).items() if names & forbidden}
    assert offenders == {}


def test_stages_use_only_storage_checkpoints_and_urls_from_artifacts():
    allowed = {"artifacts.store", "artifacts.checkpoint", "artifacts.urls"}
    for path in (ROOT / "stages").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("artifacts"):
                assert node.module in allowed, f"{path.relative_to(ROOT)} imports {node.module}"


def test_prefect_artifacts_import_is_aliased():
    for package in ("tasks", "flows"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "prefect":
                    for alias in node.names:
                        if alias.name == "artifacts":
                            assert alias.asname == "ui_artifacts", path
