"""What a user asks for, turned into a validated recipe: `key=value` overrides (`load_recipe`, which lives in
stages/recipe/schema.py so the stage driver takes them too) and the Prefect run form.

Both edit the raw recipe mapping and then validate it with `stages.recipe.schema.validate_recipe`, so a bad value is
refused by the same bounds whether it comes from a file, an override or the form. The form's fields are typed
(`RunRequest`), so the Prefect server refuses a bad value before a run exists; what needs the recipe (a stage
name that is not in it) is a RecipeError when the flow starts.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from cascade.artifacts.config import Strict
from cascade.artifacts.layout import RUN_ID_PATTERN, run_store_root
from cascade.stages.domains import DOMAIN_CLASSES
from cascade.stages.kinds import KINDS
from cascade.stages.recipe.config_base import LearningRate, Steps
from cascade.stages.recipe.recipe_file import (
    MAX_RECIPE_BYTES,
    RECIPES_DIR,
    parse_recipe_text,
    read_recipe_bytes,
    read_recipe_file,
    resolve_recipe_path,
)
from cascade.stages.recipe.schema import (  # load_recipe: re-exported, the name every flow and CLI command uses
    Recipe,
    RecipeError,
    load_recipe,  # noqa: F401
    refuse_url_credentials,
    validate_recipe,
)

RecipeName = Literal[tuple(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))]  # type: ignore[valid-type]
DomainName = Literal[tuple(sorted(DOMAIN_CLASSES))]  # type: ignore[valid-type]
# the kinds whose steps and LR the form overrides, named in the form's help (kinds registered by then)
TRAINING_KINDS = [kind for kind, row in KINDS.items() if row.trains]


class StageOverride(Strict):
    steps: Steps | None = None
    lr: LearningRate | None = None


class RunRequest(Strict):
    """The run form of the `cascade` deployment: a shipped recipe (a dropdown) or a YAML path/URI, plus typed
    overrides of the fields users change most. Its types and bounds are the form's JSON schema."""

    recipe: RecipeName = "tiny"
    recipe_uri: str | None = Field(None, description="A recipe YAML path or file:// / s3:// URI; replaces `recipe`.")
    steps: Steps | None = Field(
        None,
        description=f"Steps of every training stage ({', '.join(TRAINING_KINDS)}); a longer warm-up is cut to them.",
    )
    lr: LearningRate | None = Field(None, description="Peak learning rate of every training stage.")
    stages: dict[str, StageOverride] = Field({}, description="Per stage, by name: steps and lr (win over the above).")
    domains: list[DomainName] | None = Field(
        None,
        min_length=1,
        description="Train and evaluate only these of the recipe's domains; an RL or "
        "difficulty stage left with none of its domains is dropped.",
    )
    storage_root: str | None = Field(
        None,
        pattern=r"^(file|s3)://([^/?#@]+|[^/?#@]*/.*)$",  # no user:pw@
        description="file:///dir or s3://bucket/prefix; credentials come from the "
        "environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE)",
    )
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Continue this run; empty: a new run.")

    @model_validator(mode="before")
    @classmethod
    def _no_url_credentials(cls, raw: Any) -> Any:
        return refuse_url_credentials(raw)


def read_store_uri(uri: str) -> bytes:
    """The bytes of one recipe file at a store URI (file://, s3://), at most MAX_RECIPE_BYTES: a file:// URI naming
    a FIFO or a device is refused without being read, and an S3 object by its size before it is fetched."""
    from cascade.artifacts.config import StorageConfig
    from cascade.artifacts.store import Store

    if uri.startswith("file://"):
        return read_recipe_bytes(uri)
    parent, name = uri.rstrip("/").rsplit("/", 1)
    store = Store.from_config(StorageConfig(root=parent))
    if store.size(name) > MAX_RECIPE_BYTES:
        raise RecipeError(f"recipe {uri} is larger than {MAX_RECIPE_BYTES} bytes")
    return store.read_bytes(name)


def load_any_recipe(source: str) -> Recipe:
    """A shipped recipe name, a YAML path, or a recipe file at a store URI (a run's `runs/<id>/recipe.json`)."""
    if "://" in source:  # a run's own recipe, read as that run stored it, in the store that holds the run now
        request = RunRequest(recipe_uri=source, storage_root=run_store_root(source))
        return request_recipe(request, read_uri=read_store_uri, stored=True)
    return load_recipe(source)


def request_recipe(req: RunRequest, read_uri: Callable[[str], bytes] | None = None, stored: bool = False) -> Recipe:
    """The recipe a run form asks for: the named or given recipe with the form's overrides applied.

    `read_uri(uri) -> bytes` reads a recipe given by URI (the caller owns storage access); stored: that recipe is
    a run's stored one (validate_recipe)."""
    source = req.recipe_uri or req.recipe
    if req.recipe_uri and "://" in req.recipe_uri:
        if read_uri is None:
            raise RecipeError(f"cannot read recipe URI {req.recipe_uri!r} here")
        raw = parse_recipe_text(read_uri(req.recipe_uri), req.recipe_uri)
        raw.setdefault("name", Path(req.recipe_uri).stem)
    else:
        raw = read_recipe_file(resolve_recipe_path(source))
    _override_stages(raw, req)
    if req.domains is not None:
        _restrict_domains(raw, req.domains, source)
    if req.storage_root is not None:
        raw.setdefault("storage", {})["root"] = req.storage_root
    return validate_recipe(raw, source=source, stored=stored)


def _override_stages(raw: dict[str, Any], req: RunRequest) -> None:
    stages = raw.get("stages") or []
    names = [s.get("name", s.get("kind")) for s in stages]
    unknown = sorted(set(req.stages) - set(names))
    if unknown:
        raise RecipeError(f"stages: no stage named {unknown} (stages: {names})")
    for stage, name in zip(stages, names):
        row = KINDS.get(stage.get("kind"))
        if row is None or not row.trains:
            if name in req.stages:
                raise RecipeError(f"stages.{name}: a {stage.get('kind')} stage has no steps or lr")
            continue
        per_stage = req.stages.get(name, StageOverride())
        steps = per_stage.steps if per_stage.steps is not None else req.steps
        lr = per_stage.lr if per_stage.lr is not None else req.lr
        for field, value in (("steps", steps), ("lr", lr)):
            if value is not None:
                stage[field] = value
        warmup = row.config.model_fields.get("warmup_steps")
        if warmup is not None and (per_stage.steps or req.steps) is not None:
            # a stage the form shortens warms up over at most its steps (a longer warm-up is refused)
            stage["warmup_steps"] = min(stage.get("warmup_steps", warmup.default), stage["steps"])


def _restrict_domains(raw: dict[str, Any], keep: list[str], source: str) -> None:
    """Only `keep` of the recipe's domains; a stage that names domains and is left with none is dropped."""
    declared = raw.get("domains") or {}
    missing = sorted(set(keep) - set(declared))
    if missing:
        raise RecipeError(f"domains: {missing} not in recipe {source} (it has {sorted(declared)})")
    raw["domains"] = {d: spec for d, spec in declared.items() if d in keep}
    kept = []
    for stage in raw.get("stages") or []:
        listed = stage.get("domains")
        if listed is not None:
            stage["domains"] = [d for d in listed if d in keep]
            if not stage["domains"]:
                continue
        if stage.get("teachers"):
            stage["teachers"] = {d: t for d, t in stage["teachers"].items() if d in keep}
        kept.append(stage)
    raw["stages"] = kept
