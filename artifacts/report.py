"""The run's record, `<store>/runs/<run_id>/report.json`: stages, evals after each stage, gate decisions.

Rewritten after every change, so a run cut off anywhere still has an accurate record of what finished. A stage's
record may carry its kind's report card (`ReportCard`), so the HTML page draws any kind's card without knowing it.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cascade.artifacts.layout import report_key
from cascade.artifacts.store import Store


class Breakdown(BaseModel):
    """A table of one row per metric-key suffix: the first column, headed `label`, is the suffix; each of `columns`
    (header, prefix) shows metric `<prefix><suffix>`. E.g. domain | rows (`rows/<domain>`) | tokens
    (`tokens/<domain>`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    columns: tuple[tuple[str, str], ...]


class ReportCard(BaseModel):
    """What the run report's Data section shows of a stage, from its metrics and plots. A stage kind's row declares
    it (stages/kinds/<kind>/__init__.py), the stage task writes it into the stage's record, and
    artifacts/html_report.py draws every card the same way."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    title: str  # the card's heading, before the stage's name
    totals: tuple[tuple[str, str], ...] = ()  # (header, metric key): one row of the stage's figures
    breakdowns: tuple[Breakdown, ...] = ()
    plots: tuple[str, ...] = ()  # names of the stage's plots (its record's `plots`), drawn under the tables


class RunReport(BaseModel):
    run_id: str
    recipe: str
    stages: list[dict[str, Any]] = Field(default_factory=list)
    evals: list[dict[str, Any]] = Field(default_factory=list)
    gate: list[dict[str, Any]] = Field(default_factory=list)
    links: dict[str, str] = Field(default_factory=dict)  # "mlflow", "prefect": where else the run is shown
    status: str | None = None  # how the last finish ended: FINISHED or FAILED (None while it runs)
    stopped: str | None = None  # a failed run: what stopped it (the exception's first line)

    @classmethod
    def load(cls, store: Store, run_id: str) -> RunReport | None:
        key = report_key(run_id)
        return cls.model_validate_json(store.read_bytes(key)) if store.exists(key) else None

    def save(self, store: Store) -> None:
        store.write_bytes(report_key(self.run_id), json.dumps(self.model_dump(), indent=1).encode())

    def record_stage(self, entry: dict[str, Any]) -> None:
        _upsert(self.stages, "name", entry)

    def record_eval(self, after_stage: str, scores: dict[str, float]) -> None:
        _upsert(self.evals, "after_stage", {"after_stage": after_stage, "scores": scores})

    def evals_through(self, stage: str) -> list[dict[str, Any]]:
        """The evals up to and including the one after `stage` (a resumed run may have later ones)."""
        names = [e["after_stage"] for e in self.evals]
        return self.evals[: names.index(stage) + 1] if stage in names else list(self.evals)

    def forgetting_matrix(self) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
        """Score columns (each domain's primary metric with its greedy column after it), and one row per eval:
        (after_stage, score per column)."""
        domains = sorted({d for e in self.evals for d in e["scores"]}, key=column_order)
        return domains, [(e["after_stage"], [e["scores"].get(d) for d in domains]) for e in self.evals]


GREEDY_COLUMN = "greedy/"  # greedy pass@1 beside a domain's sampled primary metric, e.g. "greedy/math"
# pass@k of the same k sampled answers, e.g. "pass@8/math": an item counts when any of its answers is fully right
PASS_AT_COLUMN = "pass@"
# a domain's primary metric on its dev split, e.g. "dev/math": what selects (gate, teachers, baselines) where the
# eval's own column is the held-out split, which then only feeds the recorded tables
DEV_COLUMN = "dev/"
BENCHMARK_COLUMN = "bench/"  # a benchmark's score column, e.g. "bench/gsm8k": apart from domains of the same name


def pass_at_column(domain: str, k: int) -> str:
    return f"{PASS_AT_COLUMN}{k}/{domain}"


def is_side_column(column: str) -> bool:
    """A column shown beside a domain's primary metric (greedy, pass@k, dev) or a benchmark's (IFEval's other
    numbers, `bench/ifeval:prompt_loose`), never a bar the gate or a baseline holds a checkpoint to."""
    return column.startswith((GREEDY_COLUMN, PASS_AT_COLUMN, DEV_COLUMN)) or ":" in column


def selection_column(domain: str, scores: dict[str, float]) -> str:
    """The column that selects for a domain (the gate, teachers, baselines): its dev score where the eval has one,
    else the domain's own column."""
    dev = DEV_COLUMN + domain
    return dev if dev in scores else domain


def column_order(column: str) -> tuple[str, int]:
    """A domain's greedy column sorts right after its primary one, then its pass@k, then its dev score."""
    prefixes = (GREEDY_COLUMN, PASS_AT_COLUMN, DEV_COLUMN)
    side = next((i + 1 for i, prefix in enumerate(prefixes) if column.startswith(prefix)), 0)
    return column.split("/", 1)[1] if side else column, side


def _upsert(rows: list[dict[str, Any]], key: str, entry: dict[str, Any]) -> None:
    """Replace the row with the same key in place (a resumed run keeps the order), else append."""
    for i, row in enumerate(rows):
        if row[key] == entry[key]:
            rows[i] = entry
            return
    rows.append(entry)
