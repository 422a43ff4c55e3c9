"""Thin Prefect tasks of the regression-eval and recover flows: resolve, evaluate, judge, record, emit.

The event `cascade.regression.detected` is emitted once per regressed checkpoint (not per domain), so the
automation starts one recovery per checkpoint: its resource is `cascade.checkpoint.<name as given>`; the payload
holds the recipe, baseline, checkpoint URI and `regressions` (domain, score, baseline, drop, tolerance, worst
first); one related resource per regressed domain, `cascade.domain.<domain>` with role `regressed-domain` and
the label `cascade.drop`.
"""

from __future__ import annotations

import json
from typing import Any

from prefect import artifacts as ui_artifacts
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from cascade.artifacts.checkpoint import CheckpointRef, committed
from cascade.artifacts.model_registry import registered_checkpoint
from cascade.artifacts.records import EvalRecord
from cascade.artifacts.report import EvalScores
from cascade.artifacts.store import Store
from cascade.stages.evals.evaluate import evaluate_model
from cascade.stages.evals.regression import Baseline, compare, load_baseline, raise_to, save_baseline
from cascade.stages.recipe.schema import Recipe
from cascade.tasks.lifecycle import artifact_key, write_report

REGRESSION_EVENT = "cascade.regression.detected"
CHECKPOINT_RESOURCE = "cascade.checkpoint."


class CheckpointNotFound(LookupError):
    pass


def resolve_checkpoint(recipe: Recipe, name: str) -> CheckpointRef:
    """A committed checkpoint in the recipe's store from a registry alias (`models:/<model>@<alias>`), a store
    URI or local path, or a key relative to the store root (`runs/<run_id>/<NN>-<stage>`)."""
    store = Store.from_config(recipe.storage)
    uri = registered_checkpoint(recipe.tracking.resolved_uri(), name) if name.startswith("models:/") else name
    key = store.key_of(uri) if "://" in uri or uri.startswith("/") else uri.strip("/")
    if key is None:
        raise CheckpointNotFound(f"{name}: {uri} is outside the recipe's store {store.uri('')}")
    ref = committed(store, key) if key else None
    if ref is None:
        raise CheckpointNotFound(f"{name}: no committed checkpoint at {store.uri(key)}")
    return ref


def eval_targets(recipe: str | None, checkpoints: list[str] | None) -> tuple[str, list[str] | None]:
    """(the recipe to load, the checkpoints to evaluate; None: the recipe's registry default). Without a recipe:
    the newest finished run in the default store, its own recipe and its final checkpoint."""
    if recipe is not None:
        return recipe, checkpoints
    from cascade.artifacts.config import StorageConfig
    from cascade.stages.evals.regression import newest_finished_run

    store = Store.from_config(StorageConfig())
    run = newest_finished_run(store)
    if run is None:
        raise LookupError(
            f"no recipe given and no finished run in {store.uri('')} to evaluate: run a recipe first "
            "(`cascade run`), or give the recipe and checkpoint (the deployment's parameters, or --recipe)"
        )
    return run.recipe_uri, checkpoints or [run.checkpoint]


@task(name="eval-targets", cache_policy=NO_CACHE)
def eval_targets_task(recipe: str | None, checkpoints: list[str] | None) -> tuple[str, list[str] | None]:
    return eval_targets(recipe, checkpoints)


@task(name="resolve-checkpoint", cache_policy=NO_CACHE)
def resolve_task(recipe: Recipe, name: str) -> CheckpointRef:
    return resolve_checkpoint(recipe, name)


@task(name="load-baseline", cache_policy=NO_CACHE)
def load_baseline_task(recipe: Recipe, name: str) -> Baseline | None:
    return load_baseline(Store.from_config(recipe.storage), name)


@task(name="evaluate-checkpoint", cache_policy=NO_CACHE)
def evaluate_checkpoint_task(recipe: Recipe, name: str, ref: CheckpointRef, key: str) -> EvalRecord:
    """Every recipe domain's held-out score; the eval record (with `checkpoint`, the name it was asked by) is
    written to `key`, so `cascade baseline set` can take it. Returns it without its per-item rows."""
    scores, rows = evaluate_model(recipe, ref)
    record = EvalRecord(checkpoint=name, model=ref.uri, digest=ref.digest, scores=scores, items=rows)
    Store.from_config(recipe.storage).write_bytes(key, record.to_json())
    return record.model_copy(update={"items": []})


@task(name="judge", cache_policy=NO_CACHE)
def judge_task(recipe: Recipe, baseline: Baseline | None, record: EvalRecord) -> list[dict[str, Any]]:
    tolerances = recipe.tolerances()
    return compare(record.checkpoint or record.model, record.scores, baseline, tolerances)


@task(name="emit-regression", cache_policy=NO_CACHE)
def emit_regression_task(
    recipe_source: str, baseline: str, record: EvalRecord, regressed: list[dict[str, Any]]
) -> str | None:
    """The `cascade.regression.detected` event of one checkpoint; returns its id (None: events are off)."""
    worst_first = sorted(regressed, key=lambda r: -r["drop"])
    event = emit_event(
        REGRESSION_EVENT,
        resource={
            "prefect.resource.id": CHECKPOINT_RESOURCE + record.checkpoint,
            "prefect.resource.name": record.checkpoint,
            "cascade.checkpoint.uri": record.model,
        },
        related=[
            {
                "prefect.resource.id": f"cascade.domain.{r['domain']}",
                "prefect.resource.role": "regressed-domain",
                "cascade.drop": str(r["drop"]),
            }
            for r in worst_first
        ],
        payload={
            "recipe": recipe_source,
            "baseline": baseline,
            "checkpoint": record.checkpoint,
            "checkpoint_uri": record.model,
            "digest": record.digest,
            "regressions": [
                {k: r[k] for k in ("domain", "score", "baseline", "drop", "tolerance")} for r in worst_first
            ],
        },
    )
    return str(event.id) if event else None


@task(name="publish-verdicts", cache_policy=NO_CACHE)
def publish_verdicts_task(recipe: Recipe, baseline: str, key: str, rows: list[dict[str, Any]], artifact: str) -> None:
    """The checkpoint x domain table: a Prefect table artifact (key `<artifact>-<baseline>`) and the JSON at key."""
    Store.from_config(recipe.storage).write_bytes(key, json.dumps(rows, indent=1).encode())
    ui_artifacts.create_table_artifact(
        shown_rows(rows),
        key=artifact_key(artifact, baseline),
        description=f"Held-out score vs baseline {baseline!r} per checkpoint and domain",
    )


def shown_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as the UI's table shows them: scores, baselines and drops to 3 decimals, as `cascade baseline show`
    and the regression eval's terminal table print them (the JSON at the store keeps every digit)."""
    return [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in rows]


@task(name="raise-baseline", cache_policy=NO_CACHE)
def raise_baseline_task(recipe: Recipe, name: str, records: list[EvalRecord]) -> Baseline:
    store = Store.from_config(recipe.storage)
    baseline = load_baseline(store, name)
    for record in records:
        baseline = raise_to(baseline, name, record)
    save_baseline(store, baseline)
    return baseline


@task(name="record-recovered", cache_policy=NO_CACHE)
def record_recovered_task(recipe: Recipe, run_id: str, scores: EvalScores) -> None:
    """The recovered checkpoint's scores in the run report, as an eval after its stage."""
    write_report(recipe, run_id, lambda report: report.record_eval(scores.after_stage, scores.scores))
