"""No module of ours is over 400 lines, so each one can be read whole: a module that outgrows it is split by what it
holds (as stages/ holds one package per stage kind, stages/kinds/, apart from the configs every kind builds on).
And no two modules share a file name (`__init__.py` and `__main__.py` aside), so a name says which module it is:
the CLI's command modules are named for their commands (flows/cli/eval_commands.py), not for what they call."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "stages", "artifacts", "infra", "sandbox")
MAX_LINES = 400
SHARED_NAMES = {"__init__.py", "__main__.py"}  # every package has its own


def oversized(root: Path) -> list[str]:
    """`path: N lines` for every .py module of the packages under root that is longer than MAX_LINES."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def shared_names(root: Path) -> list[str]:
    """`name: path, path, ...` for every .py file name that more than one module of the packages under root has."""
    paths: dict[str, list[str]] = defaultdict(list)
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.name not in SHARED_NAMES:
                paths[path.name].append(str(path.relative_to(root)))
    return [f"{name}: {', '.join(found)}" for name, found in sorted(paths.items()) if len(found) > 1]


def test_no_module_is_over_400_lines():
    assert oversized(ROOT) == []


def test_a_401_line_module_is_caught(tmp_path):
    (tmp_path / "stages" / "kinds").mkdir(parents=True)
    (tmp_path / "stages" / "kinds" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "stages" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == [f"stages/kinds/long.py: {MAX_LINES + 1} lines"]


def test_no_two_modules_share_a_file_name():
    assert shared_names(ROOT) == []


def test_two_modules_of_one_name_are_caught(tmp_path):
    for folder in ("flows/cli", "tasks", "stages/evals", "stages/kinds/sft"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "flows" / "cli" / "__main__.py").write_text("")
    (tmp_path / "stages" / "__main__.py").write_text("")
    for folder in ("flows/cli", "stages/evals", "tasks"):
        (tmp_path / folder / "regression.py").write_text("x = 1\n")
    (tmp_path / "stages" / "kinds" / "sft" / "run_sft.py").write_text("x = 1\n")
    assert shared_names(tmp_path) == [
        "regression.py: flows/cli/regression.py, tasks/regression.py, stages/evals/regression.py"
    ]
