"""What a launched stage's ranks send back, and how the stage task takes it: rank 0's metric, progress and result
events (a JSON line each under torchrun, a dict on a Ray queue under Ray), and the one-line failure of a job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.context import StageContext, StageResult


class DistributedStageError(RuntimeError):
    """A launched job of a stage (torchrun or Ray) failed; the message is one line."""


def forward_event(ctx: StageContext, event: dict[str, Any]) -> StageResult | None:
    """One of rank 0's events into this process's sink and progress callback; the stage's result, if it is one."""
    if "log" in event:
        ctx.log.log(*event["log"])
    elif "restore" in event:
        restore = getattr(ctx.log, "restore", None)
        if restore is not None:
            restore(*event["restore"])
    elif "progress" in event:
        ctx.progress(*event["progress"])
    elif "result" in event:
        r = event["result"]
        return StageResult(CheckpointRef.model_validate(r["checkpoint"]), r["metrics"], r["plots"])
    return None


class EventSink:
    """Rank 0's metric sink and progress callback: one JSON line per event, flushed at once."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8")

    def _write(self, event: dict[str, Any]) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._write({"log": [step, metrics]})

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        self._write({"restore": [step, history]})

    def progress(self, done: int, total: int) -> None:
        self._write({"progress": [done, total]})

    def result(self, result: StageResult) -> None:
        self._write({"result": {"checkpoint": result.checkpoint.model_dump(mode="json"), "metrics": result.metrics,
                                "plots": result.plots}})


class NullSink:
    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass
