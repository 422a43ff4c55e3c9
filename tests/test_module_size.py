"""No module of ours is over 500 lines, so each one can be read whole: a module that outgrows it is split by what it
holds (as stages/ holds one package per stage kind, stages/kinds/, apart from the configs every kind builds on)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "stages", "artifacts", "infra", "sandbox")
MAX_LINES = 500


def oversized(root: Path) -> list[str]:
    """`path: N lines` for every .py module of the packages under root that is longer than MAX_LINES."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_module_is_over_500_lines():
    assert oversized(ROOT) == []


def test_a_501_line_module_is_caught(tmp_path):
    (tmp_path / "stages" / "kinds").mkdir(parents=True)
    (tmp_path / "stages" / "kinds" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "stages" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    assert oversized(tmp_path) == [f"stages/kinds/long.py: {MAX_LINES + 1} lines"]
