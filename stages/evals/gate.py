"""Regression gate: after every stage, compare each domain with its best score so far in the run.

Each domain is compared on its selection column: its dev split where the eval scores one (`dev/<domain>`), so the
held-out split never selects anything; a domain without a dev split (a benchmark) on its own column. A domain
fires when best - now > tolerance (absolute score points, per domain in the recipe). The policy says
what the flow does: `warn` records and continues, `fail` stops the run, `recover` runs MOPD with the best
checkpoint per domain as teachers. This module only decides; the flow acts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from cascade.artifacts.report import EvalScores, GateDecision
from cascade.artifacts.score_columns import ScoreColumn

if TYPE_CHECKING:
    from cascade.stages.recipe.config_base import StageConfig
    from cascade.stages.recipe.schema import Recipe

Policy = Literal["recover", "warn", "fail"]


def best_so_far(evals: list[EvalScores], column: ScoreColumn) -> tuple[float, str] | None:
    """(best score, stage that holds it) over earlier evals, or None if the column was never scored. The score is
    the column's selection column: a domain's dev split where the eval scored one."""
    scored = [(selected[1], e.after_stage) for e in evals if (selected := e.selected(column)) is not None]
    return max(scored, key=lambda s: s[0]) if scored else None


def decide(
    stage: str, evals: list[EvalScores], now: EvalScores, tolerances: dict[str, float], policy: Policy
) -> list[GateDecision]:
    """One decision per regressed column the recipe gates (a domain, a benchmark); `evals` are the evals before
    this stage's."""
    decisions = []
    for key in sorted(now.scores):
        if key not in tolerances:  # greedy/<domain>: shown beside the primary metric, not gated
            continue
        gated = ScoreColumn.parse(key)
        best, selected = best_so_far(evals, gated), now.selected(gated)
        if best is None or selected is None:
            continue
        column, score = selected
        drop = best[0] - score
        if drop > tolerances[key]:
            decisions.append(
                GateDecision(
                    stage=stage,
                    domain=key,
                    column=column.key,
                    best=best[0],
                    best_stage=best[1],
                    now=score,
                    drop=round(drop, 4),
                    tolerance=tolerances[key],
                    action=policy,
                )
            )
    return decisions


def best_stages(evals: list[EvalScores], domains: list[str]) -> dict[str, str]:
    """domain -> the stage whose checkpoint holds the best score on it (the MOPD teacher for that domain)."""
    found = {d: best_so_far(evals, ScoreColumn(d)) for d in domains}
    return {d: best[1] for d, best in found.items() if best is not None}


def with_teachers(cfg: StageConfig, recipe: Recipe, evals: list[EvalScores]) -> StageConfig | None:
    """A stage that takes teachers (`teachers: auto`, or the gate's recovery) with them chosen: per domain
    (cfg.domains, default every recipe domain), the stage whose checkpoint holds that domain's best dev score in
    `evals`; None when none of those domains was evaluated."""
    teachers = best_stages(evals, cfg.domains or list(recipe.domains))
    return cfg.model_copy(update={"teachers": teachers}) if teachers else None
