"""What a launched stage's ranks get and send back: the spec each rank runs, the rank's run, rank 0's metric,
progress, log and result events (a JSON line each under torchrun, a dict on a Ray queue under Ray) and how the stage
task takes them, and the one-line failure of a job."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.kinds import StageInputs, run_stage
from cascade.stages.train.context import MetricSink, StageContext, StageResult, stage_workdir


def error_line(error: BaseException) -> str:
    """A rank's error as one line: its type and the first line of its message."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"


def rank_spec(cfg: Any, ctx: StageContext, inputs: StageInputs) -> dict[str, Any]:
    """What every rank needs to run the stage (pickled to it by the launcher)."""
    return {"recipe": ctx.recipe, "run_id": ctx.run_id, "key": ctx.key, "cfg": cfg, "inputs": inputs}


def run_rank(spec: dict[str, Any], rank: int, sink: Any) -> None:
    """One rank of a launched stage, in the process group its launcher set up: run the stage; rank 0 reports its
    events and result to `sink`."""
    from cascade.artifacts.store import Store

    ours = logging.getLogger("cascade")
    forward = ForwardLogs(sink) if rank == 0 else None
    if forward is not None:
        ours.addHandler(forward)
        ours.setLevel(logging.INFO)
    try:
        with stage_workdir() as workdir:
            ctx = StageContext(
                spec["recipe"],
                Store.from_config(spec["recipe"].storage),
                spec["run_id"],
                spec["key"],
                sink,
                progress=sink.progress if rank == 0 else lambda done, total: None,
                workdir=workdir,
            )
            result = run_stage(spec["cfg"], ctx, spec["inputs"])
    finally:
        if forward is not None:
            ours.removeHandler(forward)
    if rank == 0:
        sink.result(result)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def forward_event(ctx: StageContext, event: dict[str, Any]) -> StageResult | None:
    """One of rank 0's events into this process's sink and progress callback; the stage's result, if it is one."""
    if "log" in event:
        ctx.log.log(*event["log"])
    elif "note" in event:
        name, level, message = event["note"]
        logging.getLogger(name).log(level, message)
    elif "restore" in event:
        ctx.log.restore(*event["restore"])
    elif "progress" in event:
        ctx.progress(*event["progress"])
    elif "result" in event:
        r = event["result"]
        return StageResult(CheckpointRef.model_validate(r["checkpoint"]), r["metrics"], r["plots"])
    return None


class ForwardLogs(logging.Handler):
    """Rank 0's INFO and above of our own loggers (where the rollout server was placed, ...), sent as events: the
    task logs them under the same names, as if it ran the stage itself; a Ray worker's own log is out of sight."""

    def __init__(self, sink: EventSink):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.note(record.name, record.levelno, record.getMessage())


class EventSink(MetricSink):
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

    def note(self, name: str, level: int, message: str) -> None:
        self._write({"note": [name, level, message]})

    def result(self, result: StageResult) -> None:
        self._write(
            {
                "result": {
                    "checkpoint": result.checkpoint.model_dump(mode="json"),
                    "metrics": result.metrics,
                    "plots": result.plots,
                }
            }
        )


class NullSink(MetricSink):
    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass
