"""A stage's per-step metrics in the store, `runs/<run_id>/metrics/<NN>-<stage>.jsonl`: the run report's curves.

One JSON row per step, `{"step": N, "metrics": {...}}`, ordered by step. The log stays exact under resume: a
resumed training stage continues from a step checkpoint whose `history` holds every step up to it, and hands
that history to `restore()`, which replaces the log with it; the steps logged after that checkpoint by the
attempt that died are dropped and logged again by this one. Without a restore (a stage that is not resumable,
or a fresh start), a step before the last one held means the stage started over: the rows from that step on are
replaced. A second log of the last step adds its metrics to that step's row (the reward model's checks and its
held-out result at the step it ends on). Either way no step is written twice and none is lost.

The whole file is rewritten (object stores have no append) at most every FLUSH_S seconds, on restore, and on
close; a crash loses at most the rows of the last few seconds, which the resume puts back from the history.
"""

from __future__ import annotations

import json
import time
from typing import Any

from cascade.artifacts.layout import metrics_dir, metrics_key
from cascade.artifacts.store import Store

FLUSH_S = 5.0


class StepLog:
    """A MetricSink writing one stage's steps to the store."""

    def __init__(self, store: Store, run_id: str, index: int, stage: str):
        self.store, self.key = store, metrics_key(run_id, index, stage)
        self.rows: list[dict[str, Any]] = read_rows(store, self.key)
        self._flushed_at = 0.0
        self._dirty = False

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}
        if self.rows and step == self.rows[-1]["step"]:  # more of the last step's metrics (a check, a final eval)
            self.rows[-1]["metrics"].update(clean)
        else:
            if self.rows and step < self.rows[-1]["step"]:
                self.rows = [r for r in self.rows if r["step"] < step]  # the stage started over from `step`
            self.rows.append({"step": step, "metrics": clean})
        self._dirty = True
        if time.monotonic() - self._flushed_at >= FLUSH_S:
            self.flush()

    def restore(self, step: int, history: list[dict[str, float]]) -> None:
        """A resume from the step checkpoint at `step`: its history (one entry per step 1..step) is the log."""
        first = step - len(history) + 1
        self.rows = [
            {
                "step": first + i,
                "metrics": {k: float(v) for k, v in h.items() if isinstance(v, (int, float)) and v == v},
            }
            for i, h in enumerate(history)
        ]
        self._dirty = True
        self.flush()

    def flush(self) -> None:
        if self._dirty:
            self.store.write_bytes(self.key, "".join(json.dumps(r) + "\n" for r in self.rows).encode())
            self._dirty = False
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        self.flush()


def read_rows(store: Store, key: str) -> list[dict[str, Any]]:
    """The rows of one log; a torn last line (a write cut off on a store without atomic puts) is skipped."""
    if not store.exists(key):
        return []
    rows = []
    for line in store.read_bytes(key).decode(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("metrics"), dict):
            rows.append(row)
    return rows


def read_run(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """stage name -> its rows, for every stage of the run that logged steps (file `<NN>-<stage>.jsonl`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    prefix = metrics_dir(run_id)
    for name in sorted(store.list(prefix)):
        base = name.rsplit("/", 1)[-1]
        if base.endswith(".jsonl") and "-" in base:
            out[base[: -len(".jsonl")].split("-", 1)[1]] = read_rows(store, f"{prefix}/{base}")
    return out
