"""The regression-eval flow: evaluate named checkpoints, compare each domain with a stored baseline, alert.

Parameters: a recipe (shipped name, YAML path, or a store URI of a run's recipe.json: domains, eval sizes,
tolerances, store, tracking), the checkpoints (registry aliases `models:/<model>@<alias>`, store URIs, or store
keys), and a baseline name (`<store>/baselines/<name>.json`). Without a recipe: the newest finished run in the
default store, its own recipe and its final checkpoint, looked up when the run starts (what the scheduled
deployment does out of the box). With a recipe and no checkpoint: the recipe's newest final stage,
`models:/cascade-<recipe>@stage-<last model stage>`. Every checkpoint is compared with the baseline as it was when
the run started; with `update_baseline`, or when the baseline does not exist yet, each domain's baseline is then
raised to the best score of this run where that is higher. The run writes `<store>/regression/<eval_id>/` (one eval
record per checkpoint, verdicts.json), a table artifact `regression-<baseline>`, one `cascade.regression.detected`
event per regressed checkpoint, and on a regression it ends Failed (RegressionFound, naming the worst drops), a
state an automation or a notification on flow-run failure acts on.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from prefect import flow

from cascade.artifacts import layout
from cascade.artifacts.model_registry import alias_for, registered_model_name
from cascade.flows.recipes import load_any_recipe
from cascade.infra.flow_outcomes import expected_outcomes_in_one_line
from cascade.stages.evals.regression import RegressionFound, regressions, verdict_lines
from cascade.stages.recipe.schema import Recipe
from cascade.tasks.regression_tasks import (
    emit_regression_task,
    eval_targets_task,
    evaluate_checkpoint_task,
    judge_task,
    load_baseline_task,
    publish_verdicts_task,
    raise_baseline_task,
    resolve_task,
)


def default_checkpoints(recipe: Recipe) -> list[str]:
    last = recipe.model_stages()[-1].name
    return [f"models:/{registered_model_name(recipe.name)}@{alias_for('stage', last)}"]


def new_eval_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@flow(name="regression-eval", flow_run_name="regression-eval-{baseline}", log_prints=True)
def regression_eval_flow(
    recipe: str | None = None,
    checkpoints: list[str] | None = None,
    baseline: str = "nightly",
    update_baseline: bool = False,
) -> list[dict[str, Any]]:
    """Rows of the checkpoint x domain table: score, baseline, drop, tolerance, verdict; RegressionFound (the run
    ends Failed, in one line) when a domain regressed."""
    expected_outcomes_in_one_line()
    recipe, checkpoints = eval_targets_task(recipe, checkpoints)
    loaded = load_any_recipe(recipe)
    names = checkpoints or default_checkpoints(loaded)
    eval_id = new_eval_id()
    stored = load_baseline_task(loaded, baseline)
    rows: list[dict[str, Any]] = []
    records = []
    for name in names:
        ref = resolve_task.with_options(task_run_name=f"resolve-{name}")(loaded, name)
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")
        record = evaluate_checkpoint_task.with_options(task_run_name=f"evaluate-{name}")(
            loaded, name, ref, layout.regression_record_key(eval_id, slug)
        )
        verdicts = judge_task.with_options(task_run_name=f"judge-{name}")(loaded, stored, record)
        if regressions(verdicts):
            emit_regression_task(recipe, baseline, record, regressions(verdicts))
        rows += verdicts
        records.append(record)
    publish_verdicts_task(loaded, baseline, layout.regression_verdicts_key(eval_id), rows, "regression")
    if update_baseline or stored is None:
        raise_baseline_task(loaded, baseline, records)
    print("\n".join(verdict_lines(rows)))
    if stored is None:
        print(f"baseline {baseline!r} did not exist: set from this eval")
    if regressions(rows):
        raise RegressionFound(baseline, rows)
    return rows
