"""Layering, strictly one way, and no import cycles, counting imports inside functions too.

flows -> tasks -> stages -> artifacts, and infra beside flows (flows -> infra -> tasks, never infra -> flows);
stages never see Prefect or MLflow; artifacts never import stages; the sandbox imports nothing of ours. An edge is
`module -> the module it names` (`from a.b import c` names a.b.c
when that is a module of ours, else a.b); importing a submodule also runs its package's __init__, which is not
counted as an edge, so a package may re-export its submodules. Imports under `if TYPE_CHECKING:` are not edges: they
never run.
"""

import ast
import shutil
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "cascade"  # every package below installs as cascade.<package>
PACKAGES = ("stages", "artifacts", "tasks", "flows", "infra", "sandbox")
FORBIDDEN = {
    "stages": {"prefect", "mlflow", "tasks", "flows", "infra"},
    "artifacts": {"prefect", "stages", "tasks", "flows", "infra", "sandbox"},
    "tasks": {"flows", "infra"},
    "sandbox": {"prefect", "mlflow", "tasks", "flows", "stages", "artifacts", "infra"},
    "infra": {"flows"},  # beside flows at the top: the CLI imports infra, infra imports tasks, stages, artifacts
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> every module it imports (ours and third-party top-level names), anywhere in the file."""
    files = {module_name(root, p): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        names: set[str] = set()
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        type_only = {id(n) for block in ast.walk(tree) if is_type_checking_block(block) for n in ast.walk(block)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue  # `if TYPE_CHECKING:` imports run for the type checker only: no edge at run time
            if isinstance(node, ast.Import):
                names |= {a.name.removeprefix(f"{NAMESPACE}.") for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = (node.module or "").removeprefix(f"{NAMESPACE}.")
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    names.add(full if full in files else base)
        graph[mod] = {n if n in files else n.split(".")[0] for n in names} - {mod}
    return graph


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        isinstance(test, ast.Name)
        and test.id == "TYPE_CHECKING"
        or isinstance(test, ast.Attribute)
        and test.attr == "TYPE_CHECKING"
    )


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} -> {dep}"
        for mod, deps in graph.items()
        for dep in deps
        if dep.split(".")[0] in FORBIDDEN.get(mod.split(".")[0], set())
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_upward_or_forbidden_imports():
    assert layering_violations(import_graph(ROOT)) == []


def test_no_import_cycles():
    assert cycles(import_graph(ROOT)) == []


def kind_run_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a kind's run module (stages.kinds.K.run_K or below) from anywhere but that kind's own folder (its
    row loads it by name on the first call): kinds meet through stages/products.py."""
    found = []
    for mod, deps in graph.items():
        for dep in deps:
            parts = dep.split(".")
            if parts[:2] != ["stages", "kinds"] or len(parts) < 4 or parts[3] != f"run_{parts[2]}":
                continue
            if not mod.startswith(f"stages.kinds.{parts[2]}."):
                found.append(f"{mod} -> {dep}")
    return sorted(found)


def test_no_module_imports_another_kinds_run_module():
    assert kind_run_imports(import_graph(ROOT)) == []


def test_a_kind_reaching_into_another_kinds_run_module_is_caught(tmp_path):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "stages" / "kinds" / "grpo" / "probe.py").write_text(
        "def f():\n    from cascade.stages.kinds.sft.run_sft import run_sft\n"
    )
    assert kind_run_imports(import_graph(tmp_path)) == ["stages.kinds.grpo.probe -> stages.kinds.sft.run_sft"]


def test_an_artifacts_to_stages_import_or_a_cycle_is_caught(tmp_path):
    """The checks bite: the real tree plus one function-local artifacts -> stages import, and a two-module cycle."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "artifacts" / "probe.py").write_text(
        "def f():\n    from cascade.stages.recipe.schema import Recipe\n    return Recipe\n"
    )
    (tmp_path / "stages" / "probe_a.py").write_text("def f():\n    import cascade.stages.probe_b\n")
    (tmp_path / "stages" / "probe_b.py").write_text("from cascade.stages import probe_a\n")
    graph = import_graph(tmp_path)
    assert layering_violations(graph) == ["artifacts.probe -> stages.recipe.schema"]
    assert cycles(graph) == [["stages.probe_a", "stages.probe_b"]]


def test_prefect_artifacts_import_is_aliased():
    for package in ("tasks", "flows"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "prefect":
                    for alias in node.names:
                        if alias.name == "artifacts":
                            assert alias.asname == "ui_artifacts", path


def test_no_two_modules_of_stages_share_a_name():
    """A module's name says which one it is: `run_grpo.py`, not a seventh `run.py` (packages' `__init__.py` aside)."""
    names = Counter(p.name for p in (ROOT / "stages").rglob("*.py") if p.name != "__init__.py")
    assert sorted(name for name, count in names.items() if count > 1) == []
