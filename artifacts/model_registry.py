"""The MLflow model registry of a recipe, `cascade-<recipe>`: one version per stage checkpoint, aliased `stage-<stage>`
and `best-<domain>`; a registry alias (`models:/<model>@<alias>`) read back as the checkpoint it points at (what a
regression eval or a baseline may name instead of a store URI).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cascade.artifacts.tracking import CHECKPOINT_TAG, RUN_TAG, STAGE_TAG, Tracker, redact

ALIAS_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


def alias_for(prefix: str, name: str) -> str:
    return f"{prefix}-{ALIAS_CHARS.sub('-', name)}".lower()


def registered_model_name(recipe_name: str) -> str:
    return f"cascade-{ALIAS_CHARS.sub('-', recipe_name)}"


def register_stage(tracker: Tracker, stage: str, checkpoint_uri: str, best_domains: list[str]) -> Any:
    """Register the stage's model dir (`<checkpoint_uri>/model`) as a version of `cascade-<recipe>`.

    Aliases: `stage-<stage>`, and `best-<domain>` for each of best_domains (moved from an earlier version if
    one held them). Idempotent: a version with the same source is reused. Returns the ModelVersion."""
    from mlflow.exceptions import MlflowException

    client, name = tracker.client, registered_model_name(tracker.recipe.name)
    try:
        client.create_registered_model(
            name, description=f"Cascade recipe {tracker.recipe.name}: one version per stage checkpoint"
        )
    except MlflowException as e:
        if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
            raise
    source = f"{checkpoint_uri.rstrip('/')}/model"
    existing = [v for v in client.search_model_versions(f"name = '{name}'") if v.source == source]
    if existing:
        version = existing[0]
    else:
        tags = {RUN_TAG: tracker.run_id, STAGE_TAG: stage, CHECKPOINT_TAG: checkpoint_uri}
        version = client.create_model_version(
            name,
            source,
            run_id=tracker.stage_run_id(stage),
            tags=tags,
            description=f"{tracker.run_id}: after stage {stage}",
        )
    for alias in [alias_for("stage", stage), *(alias_for("best", d) for d in best_domains)]:
        client.set_registered_model_alias(name, alias, version.version)
    return version


MODEL_ALIAS = re.compile(r"^models:/([^@/]+)@([A-Za-z0-9_-]+)$")


def registered_checkpoint(tracking_uri: str, reference: str) -> str:
    """The store URI of the checkpoint a registry alias (`models:/<model>@<alias>`) points at.

    Raises LookupError (one line) for a malformed reference, an unknown model or alias."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    match = MODEL_ALIAS.match(reference)
    if match is None:
        raise LookupError(f"bad registry reference {reference!r}: expected models:/<model>@<alias>")
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri[len("sqlite:///") :]).exists():
        raise LookupError(f"{reference}: no model registry at {tracking_uri}")  # and do not create one
    try:
        version = MlflowClient(tracking_uri=tracking_uri).get_model_version_by_alias(match[1], match[2])
    except MlflowException as e:
        raise LookupError(f"{reference}: {redact(e.message).splitlines()[0]}") from None
    return version.tags.get(CHECKPOINT_TAG) or version.source.removesuffix("/model")
