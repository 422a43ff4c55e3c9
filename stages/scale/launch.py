"""Run a stage where its compute settings say: in this process, or as a `torchrun` job of N ranks.

`run_stage_where_configured` is what the stage task calls. One process (the default) runs the stage in-process,
exactly as before. More start `python -m torch.distributed.run ... -m cascade.stages.scale.launch SPEC_DIR` as a child
in its own session (process group): the task's death takes it down (a parent-death signal on torchrun, and on
each rank for torchrun's), and an error in the task kills the group. Rank 0 writes its metric, progress and
result events to SPEC_DIR/events.jsonl; this process tails that file into the stage's own sink and progress
callback, so the lease, the progress bars and MLflow see the stage as if it ran here. A rank that dies makes
torchrun stop the others and exit non-zero; the stage then fails with one line naming the rank and how it
died. Nothing is committed by a failed job except step checkpoints whose manifest rank 0 wrote (manifest
last, after a barrier), so no partial checkpoint is ever adopted.

SPEC_DIR (`cascade-torchrun-*` in the temp directory) holds only the spec, the events and torchrun's log; it
stays when the job ends, as a log does, because the failure line names that log. The stage's model copies live
in each rank's own stage workdir, removed when the rank's stage ends.

Multi-node: every node runs the same torchrun command with `compute.rdzv_endpoint`; this module launches the
node it runs on (docs/SCALE.md says what has and has not been run).
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cascade.artifacts.ports import free_port
from cascade.artifacts.scratch import owned_tempdir
from cascade.stages.errors import DistributedStageError
from cascade.stages.kinds import StageInputs, kind_of, run_stage
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.scale.rank_events import (
    EventSink,
    NullSink,
    error_line,
    forward_event,
    rank_spec,
    run_rank,
)
from cascade.stages.train.context import StageContext, StageResult

EVENTS = "events.jsonl"
SPEC = "spec.pkl"
TORCHRUN_LOG = "torchrun.log"
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def run_stage_where_configured(cfg: Any, ctx: StageContext, inputs: StageInputs) -> StageResult:
    compute = ctx.recipe.compute_for(cfg)
    if compute.runs_as == "process" or not kind_of(cfg.kind).distributable:
        return run_stage(cfg, ctx, inputs)
    if compute.runs_as == "ray":
        from cascade.stages.scale.launch_ray import run_ray

        return run_ray(cfg, ctx, inputs, compute)
    return run_torchrun(cfg, ctx, inputs, compute)


def torchrun_command(compute: ComputeConfig, spec_dir: Path) -> list[str]:
    """The torchrun command line of one node: c10d rendezvous at compute.rdzv_endpoint, or a free local port."""
    endpoint = compute.rdzv_endpoint or f"127.0.0.1:{free_port()}"
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={compute.nnodes}",
        f"--nproc-per-node={compute.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--max-restarts=0",
        "-m",
        "cascade.stages.scale.launch",
        str(spec_dir),
    ]


def run_torchrun(cfg: Any, ctx: StageContext, inputs: StageInputs, compute: ComputeConfig) -> StageResult:
    """The stage as a torchrun job; its events go to ctx.log and ctx.progress while it runs."""
    # kept when the job ends, since a failure line names its log; owned while the job runs (cascade gc --local)
    with owned_tempdir("cascade-torchrun-", remove=False) as spec_dir:
        spec = rank_spec(cfg, ctx, inputs)
        (spec_dir / SPEC).write_bytes(pickle.dumps(spec))
        (spec_dir / EVENTS).touch()
        with open(spec_dir / TORCHRUN_LOG, "wb") as log:
            proc = subprocess.Popen(
                torchrun_command(compute, spec_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
                cwd=_repo_root(),
            )
        events = EventTail(spec_dir / EVENTS)
        try:
            while proc.poll() is None:
                events.forward(ctx)
                time.sleep(POLL_S)
            events.forward(ctx)
        finally:
            if proc.poll() is None:  # this process is failing (an error in a sink, an interrupt): take the job down
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0 or events.result is None:
            raise DistributedStageError(failure_line(cfg.name, proc.returncode, spec_dir))
        return events.result


class EventTail:
    """Reads rank 0's events.jsonl as it grows: complete lines only."""

    def __init__(self, path: Path):
        self.path, self.offset, self.result = path, 0, None

    def forward(self, ctx: StageContext) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            self.result = forward_event(ctx, json.loads(line)) or self.result


def failure_line(stage: str, code: int, spec_dir: Path) -> str:
    """One line: the rank torchrun names as the root cause (the first to fail) and how: its own error's first
    line, or the signal that killed it. The other ranks' errors are consequences (a collective whose peer
    vanished: gloo's "Connection closed by peer"), so they are named only when torchrun names no root cause."""
    log = spec_dir / TORCHRUN_LOG
    root = re.search(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", log.read_text(errors="replace"), re.S)
    errors = [spec_dir / f"error-rank{root.group(1)}.txt"] if root else sorted(spec_dir.glob("error-rank*.txt"))
    if errors and errors[0].exists():
        rank = errors[0].stem.removeprefix("error-rank")
        return f"stage {stage}: rank {rank} failed: {errors[0].read_text().strip()}"
    if root:
        rank, exit_code = root.group(1), int(root.group(2))
        how = f"killed by {signal.Signals(-exit_code).name}" if exit_code < 0 else f"exit code {exit_code}"
        return f"stage {stage}: rank {rank} died ({how}); torchrun log: {log}"
    return f"stage {stage}: torchrun exited with code {code}; log: {log}"


def worker(spec_dir: Path) -> None:
    """One rank: run the stage; rank 0 reports. An error leaves its first line in error-rank<R>.txt."""
    _die_with_parent()()
    rank = int(os.environ["RANK"])
    spec = pickle.loads((spec_dir / SPEC).read_bytes())
    try:
        run_rank(spec, rank, EventSink(spec_dir / EVENTS) if rank == 0 else NullSink())
    except Exception as e:
        (spec_dir / f"error-rank{rank}.txt").write_text(error_line(e))
        raise


def _die_with_parent():
    """A preexec function (and a call in each rank): the kernel SIGKILLs this process when its parent dies."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return arm


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])


if __name__ == "__main__":
    worker(Path(sys.argv[1]))
