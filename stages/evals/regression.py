"""Scheduled regression evals: compare checkpoints with a stored per-domain baseline.

The in-run gate (`stages.evals.gate`) compares a stage with the best score earlier in the same run. A regression eval
compares any checkpoint with a baseline kept in the store across runs, `<store>/baselines/<name>.json`: per
domain, a score and the checkpoint that earned it. A domain regresses when baseline - score > the recipe's
tolerance for it (absolute score points, the gate's rule). The checkpoints behind the baseline are, per domain,
the best known ones, so they are also the MOPD teachers of a recovery.

Two ways to change a baseline: `replace` (all domains from one eval: `cascade baseline set`) and `raise_to`
(a ratchet, each domain moves only up: the flow's `update_baseline`). This module only decides and records.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from cascade.artifacts import layout
from cascade.artifacts.records import EvalRecord, EvalRecordError
from cascade.artifacts.score_columns import ScoreColumn
from cascade.artifacts.store import Store
from cascade.stages.recipe.validation_errors import first_error

log = logging.getLogger("cascade.regression")

Verdict = Literal["regressed", "ok", "no baseline"]


class BaselineEntry(BaseModel):
    score: float
    checkpoint: str  # the name it was given by (a registry alias or a URI)
    uri: str  # the checkpoint itself, in the recipe's store
    digest: str | None = None


class Baseline(BaseModel):
    name: str
    domains: dict[str, BaselineEntry] = {}
    updated: float = 0.0  # unix time of the last change


class RegressionFound(RuntimeError):
    """A regression eval found a domain below its baseline: the flow run ends Failed with this, worst drop first."""

    found = "regression(s)"

    def __init__(self, baseline: str, rows: list[dict[str, Any]]):
        self.baseline, self.rows = baseline, rows
        worst = sorted(regressions(rows), key=lambda r: -r["drop"])
        drops = "; ".join(
            f"{r['checkpoint']} {r['domain']} {r['score']:.3f} < {r['baseline']:.3f} (drop {r['drop']})" for r in worst
        )
        super().__init__(f"{len(worst)} {self.found} against baseline {baseline!r}: {drops}")

    def __reduce__(self):  # the flow run's state carries it: pickled with its own arguments, not the message
        return type(self), (self.baseline, self.rows)


class NotRecovered(RegressionFound):
    """The recover flow's checkpoint still regresses against the baseline: that flow run ends Failed with this."""

    found = "domain(s) not recovered"


def verdict_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per row of a checkpoint x domain table, as the flows print it."""
    lines = []
    for row in rows:
        baseline = "none" if row["baseline"] is None else f"{row['baseline']:.3f}"
        drop = "" if row["drop"] is None else f", drop {row['drop']:+.3f} (tolerance {row['tolerance']})"
        lines.append(
            f"{row['checkpoint']} {row['domain']}: {row['score']:.3f} vs baseline {baseline}{drop}: {row['verdict']}"
        )
    return lines


class BaselineError(ValueError):
    """A bad baseline name or eval record; the CLI prints it as one line and exits 2."""


def baseline_key(name: str) -> str:
    try:
        return layout.baseline_key(name)
    except ValueError as e:
        raise BaselineError(str(e)) from None


def load_baseline(store: Store, name: str) -> Baseline | None:
    """The stored baseline, or None where there is none; a torn or foreign file is a BaselineError."""
    key = baseline_key(name)
    if not store.exists(key):
        return None
    try:
        return Baseline.model_validate_json(store.read_bytes(key))
    except ValidationError as e:
        raise BaselineError(f"{store.uri(key)} is not a valid baseline: {first_error(e)}") from None


def save_baseline(store: Store, baseline: Baseline) -> None:
    store.write_bytes(baseline_key(baseline.name), baseline.model_dump_json(indent=1).encode())


def compare(
    checkpoint: str, scores: dict[str, float], baseline: Baseline | None, tolerances: dict[str, float]
) -> list[dict[str, Any]]:
    """One row per gated column (each domain's primary metric, each benchmark): score, baseline, drop (baseline -
    score), tolerance, verdict. A column without a tolerance (greedy/<domain>) is not compared; a domain with a dev
    score is compared on it."""
    rows = []
    for domain in sorted(scores):
        if domain not in tolerances:
            continue
        column = ScoreColumn.parse(domain).selection(scores).key
        score = scores[column]
        entry = baseline.domains.get(domain) if baseline else None
        drop = None if entry is None else round(entry.score - score, 4)
        verdict: Verdict = "no baseline" if drop is None else "regressed" if drop > tolerances[domain] else "ok"
        rows.append(
            {
                "checkpoint": checkpoint,
                "domain": domain,
                "column": column,
                "score": score,
                "baseline": entry.score if entry else None,
                "drop": drop,
                "tolerance": tolerances[domain],
                "verdict": verdict,
            }
        )
    return rows


def regressions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["verdict"] == "regressed"]


def replace(name: str, record: EvalRecord) -> Baseline:
    """A baseline holding every gated column of one eval record (each domain's primary metric, each benchmark)."""
    return Baseline(name=name, domains=_entries(record), updated=time.time())


def raise_to(baseline: Baseline | None, name: str, record: EvalRecord) -> Baseline:
    """The baseline with each domain moved up to the record's score where that is higher (or new)."""
    domains = dict(baseline.domains) if baseline else {}
    for domain, entry in _entries(record).items():
        if domain not in domains or entry.score > domains[domain].score:
            domains[domain] = entry
    return Baseline(name=name, domains=domains, updated=time.time())


def _entries(record: EvalRecord, where: str = "the eval record") -> dict[str, BaselineEntry]:
    if not record.model:
        raise BaselineError(f"{where} has no `model` (the checkpoint URI it scored)")
    name = record.checkpoint or record.model
    scores = record.scores
    bad = sorted(d for d, v in scores.items() if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0))  # NaN too
    if bad:
        raise BaselineError(f"{where}: score of {bad[0]!r} is {scores[bad[0]]!r}; a baseline takes scores in [0, 1]")
    bars = [column for column in map(ScoreColumn.parse, scores) if not column.is_side]
    if not bars:
        raise BaselineError(f"{where} holds no score to compare with: a baseline from it could never fail")
    return {
        column.key: BaselineEntry(
            score=float(scores[column.selection(scores).key]), checkpoint=name, uri=record.model, digest=record.digest
        )
        for column in bars
    }  # greedy, pass@k and dev: shown, not bars; a domain's bar is its dev score where it has one


def read_eval_record(blob: bytes, where: str) -> EvalRecord:
    """An eval record as the cascade (`runs/<id>/evals/NN-stage.json`) or a regression eval writes it."""
    try:
        record = EvalRecord.parse(blob, where)
    except EvalRecordError as e:
        raise BaselineError(str(e)) from None
    _entries(record, where)
    return record


@dataclass(frozen=True)
class FinishedRun:
    """A run that finished, as a scheduled eval picks it up when it is given no recipe."""

    run_id: str
    recipe_uri: str  # the run's own recipe, runs/<id>/recipe.json
    checkpoint: str  # the URI of its final policy (the stage of its last eval) in the store it was found in
    created: float  # when that checkpoint was committed (its manifest)


def newest_finished_run(store: Store) -> FinishedRun | None:
    """The finished run whose final policy was committed last, or None when the store holds no finished run. Its
    checkpoint and recipe are named inside `store`, wherever the run was when it ran."""
    from cascade.artifacts.report import RunReport
    from cascade.stages.recipe.config_base import SOURCE_EVAL

    found = []
    for run_id in store.list_dirs(layout.RUNS):
        try:
            report = RunReport.load(store, run_id)
        except ValueError:  # a torn or foreign report.json: not a run to evaluate
            continue
        if report is None or report.status != "FINISHED":
            continue
        evaluated = [e.after_stage for e in report.evals if e.after_stage != SOURCE_EVAL]
        last = report.stage(evaluated[-1]) if evaluated else None
        uri = last.checkpoint if last else None
        key = layout.run_relative_key(uri, run_id) if uri else None  # the report names where the store was then
        created = _committed_at(store, run_id, key) if key else None
        if created is not None:
            found.append(FinishedRun(run_id, store.uri(layout.recipe_key(run_id)), store.uri(key), created))
    return max(found, key=lambda run: run.created, default=None)


def _committed_at(store: Store, run_id: str, key: str) -> float | None:
    """When the checkpoint at `key` was committed (its manifest's `created`); None where it was not, or, with a
    warning, where its manifest does not say: one torn or foreign manifest must not stop every scheduled eval."""
    from cascade.artifacts.checkpoint import CheckpointError, read_manifest

    try:
        manifest = read_manifest(store, key)
    except CheckpointError as e:
        log.warning("run %s passed over: %s", run_id, e)
        return None
    if manifest is None:
        return None
    created = manifest.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not math.isfinite(created):
        where = f"{store.uri(key)}/{layout.MANIFEST}"
        log.warning("run %s passed over: %s has no 'created' time (it holds %r)", run_id, where, created)
        return None
    return created
