"""A process-wide hook the CLI sets to draw progress bars; tasks hand it to stages as a plain callback.

Prefect parameters must be serializable, so a live progress bar cannot travel as one.
"""

from __future__ import annotations

from typing import Callable

ProgressFactory = Callable[[str], Callable[[int, int], None]]
_factory: ProgressFactory | None = None


def set_progress_factory(factory: ProgressFactory | None) -> None:
    global _factory
    _factory = factory


def progress_for(label: str) -> Callable[[int, int], None]:
    if _factory is None:
        return lambda done, total: None
    return _factory(label)
