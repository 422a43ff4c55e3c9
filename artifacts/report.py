"""The run's record, `<store>/runs/<run_id>/report.json`: stages, evals after each stage, gate decisions.

Typed rows (`StageRecord`, `EvalScores`, `GateDecision`) written only through `RunReport`'s methods, and rewritten
after every change, so a run cut off anywhere still has an accurate record of what finished. A stage's record may
carry its kind's report card (`ReportCard`), so the HTML page draws any kind's card without knowing it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cascade.artifacts.layout import report_key
from cascade.artifacts.score_columns import ScoreColumn, column_order
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


class StageRecord(BaseModel):
    """One stage of the run: how it ended, its checkpoint, its figures."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    status: Literal["completed", "skipped", "failed"]
    checkpoint: str | None = None  # the store URI of its checkpoint (None: it failed before one was committed)
    seconds: float | None = None  # wall time of its last run (a skipped stage keeps the time it took when it ran)
    metrics: dict[str, Any] = Field(default_factory=dict)  # its figures, and a few words and maps (dtype, teachers)
    plots: dict[str, str] = Field(default_factory=dict)  # name -> store URI of an image in its checkpoint
    rebuilt: str | None = None  # why a committed checkpoint was built again
    peak_rss_mb: float | None = None  # the process's peak resident memory while it ran
    card: ReportCard | None = None  # its kind's report card
    recovers: str | None = None  # a gate's recovery stage: the stage whose regression it recovers


class EvalScores(BaseModel):
    """The eval of the policy a stage made (or of the source model): column -> score, keyed as stored by each
    column's key (`ScoreColumn.key`) and read by column."""

    model_config = ConfigDict(extra="forbid")

    after_stage: str
    scores: dict[str, float]

    def selected(self, column: ScoreColumn) -> tuple[ScoreColumn, float] | None:
        """The column that selects for `column` (its dev score where this eval has one) and its score; None when
        this eval did not score `column`."""
        if column.key not in self.scores:
            return None
        chosen = column.selection(self.scores)
        return chosen, self.scores[chosen.key]


class GateDecision(BaseModel):
    """One regressed domain after a stage: its best score so far and where, its score now, what the gate did."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    domain: str
    column: str  # the score compared: the domain's dev column where the eval has one
    best: float
    best_stage: str
    now: float
    drop: float
    tolerance: float
    action: Literal["recover", "warn", "fail"]
    after_recovery: float | None = None  # the column's score after the recovery stage

    def recovered(self, scores: EvalScores) -> GateDecision:
        """This decision with the recovery's score on its column."""
        return self.model_copy(update={"after_recovery": scores.scores[self.column]})

    @model_validator(mode="before")
    @classmethod
    def _column_of_older_records(cls, data: Any) -> Any:
        """Records written before decisions named their column compared the domain's own column."""
        if isinstance(data, dict) and "column" not in data and "domain" in data:
            return {**data, "column": data["domain"]}
        return data


class RunReport(BaseModel):
    run_id: str
    recipe: str
    stages: list[StageRecord] = Field(default_factory=list)
    evals: list[EvalScores] = Field(default_factory=list)
    gate: list[GateDecision] = Field(default_factory=list)
    links: dict[str, str] = Field(default_factory=dict)  # "mlflow", "prefect": where else the run is shown
    status: str | None = None  # how the last finish ended: FINISHED or FAILED (None while it runs)
    stopped: str | None = None  # a failed run: what stopped it (the exception's first line)

    @classmethod
    def load(cls, store: Store, run_id: str) -> RunReport | None:
        key = report_key(run_id)
        return cls.model_validate_json(store.read_bytes(key)) if store.exists(key) else None

    def save(self, store: Store) -> None:
        store.write_bytes(report_key(self.run_id), json.dumps(self.model_dump(), indent=1).encode())

    def stage(self, name: str) -> StageRecord | None:
        return next((s for s in self.stages if s.name == name), None)

    def record_stage(self, record: StageRecord) -> None:
        """Replace the stage's record in place (a resumed run keeps the order), else append it."""
        _upsert(self.stages, record, lambda s: s.name == record.name)

    def record_eval(self, after_stage: str, scores: dict[str, float]) -> None:
        _upsert(self.evals, EvalScores(after_stage=after_stage, scores=scores), lambda e: e.after_stage == after_stage)

    def evals_through(self, stage: str) -> list[EvalScores]:
        """The evals up to and including the one after `stage` (a resumed run may have later ones)."""
        names = [e.after_stage for e in self.evals]
        return self.evals[: names.index(stage) + 1] if stage in names else list(self.evals)

    def decisions_after(self, stage: str) -> list[GateDecision]:
        return [d for d in self.gate if d.stage == stage]

    def record_gate(self, stage: str, decisions: list[GateDecision]) -> None:
        """The gate's decisions after `stage`, replacing those of an earlier try of it."""
        self.gate = [d for d in self.gate if d.stage != stage] + decisions

    def record_finish(self, status: str | None, stopped: str | None = None) -> None:
        """How the run's last try ended (None, None: it runs again)."""
        self.status, self.stopped = status, stopped

    def forgetting_matrix(self) -> tuple[list[str], list[tuple[str, list[float | None]]]]:
        """Score columns (each domain's primary metric with its greedy column after it), and one row per eval:
        (after_stage, score per column)."""
        domains = sorted({d for e in self.evals for d in e.scores}, key=column_order)
        return domains, [(e.after_stage, [e.scores.get(d) for d in domains]) for e in self.evals]


def _upsert(rows: list, entry: BaseModel, same: Callable[[Any], bool]) -> None:
    """Replace the row `same` picks in place (a resumed run keeps the order), else append."""
    for i, row in enumerate(rows):
        if same(row):
            rows[i] = entry
            return
    rows.append(entry)
