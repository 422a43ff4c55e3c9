"""Where a stage's progress goes: the CLI's bars (a process-wide hook the CLI sets) and a Prefect progress
artifact per stage, plus the test-only fault hook. Tasks hand stages one plain callback.

Prefect parameters must be serializable, so a live progress bar cannot travel as one.

Fault hook (tests only, never set in production): `CASCADE_TEST_FAIL_STAGE=<run_id>/<stage>` makes that stage
of that run raise at its last step on the first attempt of its flow run (flow run_count 1), after its earlier
step checkpoints are committed. A retry of the flow run (run_count 2) passes, so tests/flows/test_deploy.py can
show that Prefect's Retry keeps completed stages and the failed stage continues from its step checkpoint.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

ProgressFactory = Callable[[str, str], Callable[[int, int], None]]  # (label, unit) -> (done, total) -> None
Progress = Callable[[int, int], None]
_factory: ProgressFactory | None = None
FAULT_ENV = "CASCADE_TEST_FAIL_STAGE"
ARTIFACT_EVERY_S = 2.0  # progress artifact updates are API calls: at most one per interval, plus the last


class InjectedFault(RuntimeError):
    """Raised by the test-only fault hook."""


def set_progress_factory(factory: ProgressFactory | None) -> None:
    global _factory
    _factory = factory


def progress_for(label: str, unit: str) -> Progress:
    """The CLI's callback for work labelled `label` that counts `unit`s (steps, items, prompts)."""
    if _factory is None:
        return lambda done, total: None
    return _factory(label, unit)


def stage_progress(label: str, unit: str, run_id: str, stage: str) -> Progress:
    """One callback: the CLI bar, the stage's Prefect progress artifact, and the fault hook."""
    parts = (progress_for(label, unit), _artifact_progress(label), _fault_hook(run_id, stage))

    def update(done: int, total: int) -> None:
        for part in parts:
            part(done, total)

    return update


def _artifact_progress(label: str) -> Progress:
    from prefect import get_run_logger
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    state: dict = {"id": None, "at": 0.0}

    def update(done: int, total: int) -> None:
        now = time.monotonic()
        if state["id"] is not None and done < total and now - state["at"] < ARTIFACT_EVERY_S:
            return
        percent = 100.0 * done / max(1, total)
        try:  # bookkeeping must never fail a training step
            if state["id"] is None:
                state["id"] = create_progress_artifact(percent, description=f"stage {label}")
            else:
                update_progress_artifact(state["id"], percent)
        except Exception as e:
            get_run_logger().warning(f"progress artifact for {label}: {e}")
        state["at"] = now

    return update


def _fault_hook(run_id: str, stage: str) -> Progress:
    if os.environ.get(FAULT_ENV) != f"{run_id}/{stage}":
        return lambda done, total: None
    from prefect.runtime import flow_run

    def fail(done: int, total: int) -> None:
        if done == total and flow_run.run_count <= 1:
            raise InjectedFault(f"{FAULT_ENV}: {stage} of {run_id} fails at step {done} on the first attempt")

    return fail
