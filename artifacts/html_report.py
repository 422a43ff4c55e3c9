"""The run report people look at: one self-contained HTML page (images embedded, no network) of a run, or of two
runs side by side.

Sections: the forgetting heatmap (stage x domain, score and standard error per cell, the best cell of each column
boxed, gate firings and recoveries marked on their rows), training curves per stage (from the step logs,
artifacts/steplog.py), data (each stage's report card: the figures, tables and plots its kind declares, e.g. the SFT
data card or the difficulty filter's pass-rate histogram), the gate timeline, cost per stage, and links
(checkpoints, the MLflow run, the Prefect flow run).

Everything is read from the store: report.json, the eval records (per-item scores: the standard errors), the
step logs and the stage checkpoints' plots. A stage's card comes with its record in report.json (`ReportCard`): the
page draws every card the same way and knows no stage kind. Plots are matplotlib (Agg), the page a jinja2 template
(`templates/report.html.j2`). A run that stopped gets a report of what exists, saying where it stopped.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cascade.artifacts import layout
from cascade.artifacts.html_template import template_env
from cascade.artifacts.records import EvalRecord, EvalRecordError
from cascade.artifacts.report import Breakdown, RunReport, StageRecord
from cascade.artifacts.report_figures import curves_png, heatmap_png
from cascade.artifacts.score_columns import ScoreColumn
from cascade.artifacts.steplog import read_run
from cascade.artifacts.store import Store

SECTIONS = [
    ("matrix", "Forgetting matrix"),
    ("curves", "Training curves"),
    ("data", "Data"),
    ("gate", "Gate timeline"),
    ("cost", "Cost per stage"),
    ("links", "Links"),
]


@dataclass
class RunData:
    """What the page shows of one run, read from the store."""

    report: RunReport
    planned: list[str]  # the recipe's stage names, in order (empty when unknown)
    items: dict[str, dict[str, dict[str, float]]]  # after_stage -> domain -> item id -> score
    steps: dict[str, list[dict[str, Any]]]  # stage -> step rows
    store_uri: str
    plots: dict[str, dict[str, str]] = field(default_factory=dict)  # stage -> its card's plot name -> PNG data URI
    targets: dict[str, list[str]] = field(default_factory=dict)  # RL stage -> the domains its gains are on

    @property
    def run_id(self) -> str:
        return self.report.run_id


def collect(
    store: Store, run_id: str, planned: list[str] | None = None, targets: dict[str, list[str]] | None = None
) -> RunData:
    """Read one run from the store; targets: stage -> the domains its gains table shows (stages.kinds.gain_targets).
    Raises LookupError when the run has no report."""
    report = RunReport.load(store, run_id)
    if report is None:
        raise LookupError(f"run {run_id!r} has no report yet")
    plots = {stage.name: card_plots(store, stage) for stage in report.stages if stage.card}
    return RunData(
        report,
        list(planned or []),
        item_scores(store, run_id),
        read_run(store, run_id),
        store.uri(layout.run_dir(run_id)),
        plots,
        dict(targets or {}),
    )


def card_plots(store: Store, stage: StageRecord) -> dict[str, str]:
    """The plots a stage's card names that exist in the store: name -> PNG data URI."""
    out = {}
    for name in stage.card.plots if stage.card else ():
        uri = stage.plots.get(name)
        key = store.key_of(uri) if uri else None
        if key and store.exists(key):
            out[name] = _data_uri(store.read_bytes(key))
    return out


def item_scores(store: Store, run_id: str) -> dict[str, dict[str, dict[str, float]]]:
    """after_stage -> domain -> item id -> held-out score, from the run's eval records (torn ones skipped)."""
    items: dict[str, dict[str, dict[str, float]]] = {}
    for key in store.list(layout.evals_dir(run_id)):
        base = key.rsplit("/", 1)[-1]
        if not base.endswith(".json") or "-" not in base:
            continue
        try:
            record = EvalRecord.parse(store.read_bytes(key), store.uri(key))
        except EvalRecordError:
            continue  # a torn record: the cell keeps its score, without a standard error
        per: dict[str, dict[str, float]] = {}
        for i, row in enumerate(record.items):
            if isinstance(row.get("score"), (int, float)) and row.get("domain"):
                per.setdefault(row["domain"], {})[str(row.get("id", i))] = float(row["score"])
        items[base[: -len(".json")].split("-", 1)[1]] = per
    return items


def standard_error(scores: Iterable[float]) -> float | None:
    """Sample standard error of the mean of item scores (binomial for 0/1 scores); None under two items."""
    scores = list(scores)
    n = len(scores)
    if n < 2:
        return None
    mean = sum(scores) / n
    return math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1) / n)


def paired_gain(before: dict[str, float], after: dict[str, float]) -> tuple[float, float | None] | None:
    """Mean of after - before over the items both evals scored, and its standard error; None if they share none.
    Pairing cancels the spread of item difficulty the two evals share, so this error is smaller than either
    score's own, and it is the one that says whether a stage moved a domain."""
    diffs = [after[i] - before[i] for i in after if i in before]
    return (sum(diffs) / len(diffs), standard_error(diffs)) if diffs else None


@dataclass(frozen=True)
class Gain:
    """What an RL stage did to one of its own domains: the held-out means before and after it, and the paired
    difference over the items both evals scored, with its standard error (None: no item moved)."""

    stage: str
    domain: str
    before: float
    after: float
    gain: float
    se: float | None

    @property
    def in_se(self) -> float | None:
        return self.gain / self.se if self.se else None


def stage_gains(
    evaluated: list[str], items: dict[str, dict[str, dict[str, float]]], targets: dict[str, list[str]]
) -> list[Gain]:
    """Each trained domain of each evaluated stage in `targets` (stage -> its domains), against the eval just
    before that stage: its primary metric, then its greedy and pass@k columns where it has them; then every
    benchmark column, where forgetting (or transfer) shows."""
    gains = []
    for before, stage in zip(evaluated, evaluated[1:]):
        after = items.get(stage, {})
        if stage not in targets:
            continue
        scored = [ScoreColumn.parse(key) for key in after]
        columns = []
        for domain in targets[stage]:
            sides = [c for c in scored if c.is_side and c.split != "bench" and c.domain == domain]
            columns += [domain, *(c.key for c in sorted(sides, key=ScoreColumn.order))]
        columns += sorted(c.key for c in scored if c.split == "bench")
        for column in columns:
            old, new = items.get(before, {}).get(column), after.get(column)
            paired = paired_gain(old, new) if old and new else None
            if paired is not None:
                mean_old, mean_new = sum(old.values()) / len(old), sum(new.values()) / len(new)
                gains.append(Gain(stage, column, mean_old, mean_new, *paired))
    return gains


def where_stopped(run: RunData) -> str | None:
    """For a run that did not finish: the stage it stopped at and why; None for a finished or running run."""
    if run.report.status != "FAILED":
        return None
    planned = run.planned
    if any(s.name not in planned and not s.recovers for s in run.report.stages):
        planned = []  # not the recipe's stage list (a recover run): say nothing of stages not run
    failed = [s.name for s in run.report.stages if s.status == "failed"]
    done = {s.name for s in run.report.stages if s.status in ("completed", "skipped")}
    pending = [name for name in planned if name not in done]
    at = failed[-1] if failed else (pending[0] if pending else None)
    why = f": {run.report.stopped}" if run.report.stopped else ""
    where = f"at stage {at}" if at else "after its last stage"
    rest = [p for p in pending if p != at]
    later = f"; not run: {', '.join(rest)}" if rest else ""
    return f"stopped {where}{why}{later}"


# ---------------------------------------------------------------------------------------------------- figures


def _data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


def matrix_cells(run: RunData) -> tuple[list[str], list[dict[str, Any]]]:
    """Domains, and per eval row: stage, cells (score, se, best), gate domains fired, whether a recovery."""
    domains, rows = run.report.forgetting_matrix()
    best = {}
    for j, d in enumerate(domains):
        col = [(scores[j], i) for i, (_, scores) in enumerate(rows) if scores[j] is not None]
        best[d] = max(col, key=lambda c: (c[0], -c[1]))[1] if col else None  # a tie: the earliest stage
    fired: dict[str, list[str]] = {}
    for g in run.report.gate:
        fired.setdefault(g.stage, []).append(g.domain)
    recoveries = {s.name for s in run.report.stages if s.recovers}
    out = []
    for i, (stage, scores) in enumerate(rows):
        cells = [
            {"score": s, "se": standard_error(run.items.get(stage, {}).get(d, {}).values()), "best": best[d] == i}
            for d, s in zip(domains, scores)
        ]
        out.append({"stage": stage, "cells": cells, "gate": fired.get(stage, []), "recovery": stage in recoveries})
    return domains, out


# ---------------------------------------------------------------------------------------------------- tables


def cost_rows(run: RunData) -> list[dict[str, Any]]:
    rows = []
    for s in run.report.stages:
        steps = run.steps.get(s.name, [])
        sampled = sum(r["metrics"].get("tokens_sampled", 0.0) for r in steps) or None
        trained = sum(r["metrics"].get("tokens_trained", 0.0) for r in steps) or None
        seconds, metrics = s.seconds, s.metrics
        rows.append(
            {
                "stage": s.name,
                "kind": s.kind,
                "status": s.status,
                "seconds": seconds,
                "steps": len(steps) or metrics.get("steps"),
                "sampled": sampled,
                "trained": trained,
                "tokens_per_s": (trained / seconds) if trained and seconds else metrics.get("tokens_per_s"),
                "peak_rss_mb": s.peak_rss_mb or metrics.get("peak_rss_mb"),
            }
        )
    return rows


def data_cards(run: RunData) -> list[dict[str, Any]]:
    """Every stage's report card that has something to show: its totals, its breakdown tables and its plots."""
    cards = []
    for s in run.report.stages:
        card, m = s.card, s.metrics
        if card is None:
            continue
        images = run.plots.get(s.name, {})
        if not m and not images:
            continue
        cards.append(
            {
                "stage": s.name,
                "title": card.title,
                "totals": [(header, m.get(key)) for header, key in card.totals],
                "tables": [breakdown_table(b, m) for b in card.breakdowns],
                "images": [(name.replace("_", "-"), images[name]) for name in card.plots if name in images],
            }
        )
    return cards


def breakdown_table(breakdown: Breakdown, metrics: dict[str, Any]) -> dict[str, Any]:
    """One row per suffix any of the columns' prefixes has in the metrics, in sorted order."""
    prefixes = [prefix for _, prefix in breakdown.columns]
    suffixes = sorted({k[len(p) :] for k in metrics for p in prefixes if k.startswith(p)})
    return {
        "headers": [breakdown.label, *(header for header, _ in breakdown.columns)],
        "rows": [(suffix, [metrics.get(p + suffix) for p in prefixes]) for suffix in suffixes],
    }


# ---------------------------------------------------------------------------------------------------- page


@dataclass
class Rendered:
    html: str
    images: dict[str, bytes]  # file name -> PNG: the heatmap and the curves, for MLflow


def render(runs: list[RunData]) -> Rendered:
    """The page of one run, or of two side by side (a comparison of recipes)."""
    images: dict[str, bytes] = {}
    views = []
    for run in runs:
        domains, matrix = matrix_cells(run)
        png = heatmap_png(run.run_id, domains, matrix)
        if png and len(runs) == 1:
            images["forgetting_matrix.png"] = png
        views.append(
            {
                "run": run,
                "report": run.report,
                "domains": domains,
                "matrix": matrix,
                "heatmap": _data_uri(png) if png else None,
                "stopped": where_stopped(run),
                "cost": cost_rows(run),
                "cards": data_cards(run),
                "gains": stage_gains([row["stage"] for row in matrix], run.items, run.targets),
            }
        )
    stages = []
    for run in runs:  # training stages in run order, the first run's first
        stages += [name for name, rows in run.steps.items() if rows and name not in stages]
    curves = []
    for stage in stages:
        png = curves_png(stage, [(run.run_id, run.steps.get(stage, [])) for run in runs])
        if png:
            curves.append(
                {"stage": stage, "image": _data_uri(png), "runs": [run.run_id for run in runs if run.steps.get(stage)]}
            )
            if len(runs) == 1:
                images[f"curves-{stage}.png"] = png
    html = (
        template_env()
        .get_template("report.html.j2")
        .render(
            views=views,
            curves=curves,
            sections=SECTIONS,
            compare=len(runs) > 1,
            title=" vs ".join(r.run_id for r in runs),
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        )
    )
    return Rendered(html, images)


def write_run_report(
    store: Store, run_id: str, planned: list[str] | None = None, targets: dict[str, list[str]] | None = None
) -> Rendered:
    """Render one run's page and write it beside report.json (`runs/<run_id>/report.html`)."""
    rendered = render([collect(store, run_id, planned, targets)])
    store.write_bytes(layout.html_report_key(run_id), rendered.html.encode())
    return rendered
