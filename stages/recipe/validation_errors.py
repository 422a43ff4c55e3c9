"""A pydantic validation error as the one line a user reads: what the recipe prints for a field it refuses, what
both registries (stage kinds, reward sources) print for a mapping their config refuses, and what a stored baseline
that does not validate is refused with."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError


def first_error(e: ValidationError, *path: str, model: type[BaseModel] | None = None) -> str:
    """A validation's first error as one line, `<path>.<location>: <message>`, without pydantic's "Value error, "
    prefix: what the recipe prints for a field it refuses, and both registries (stage kinds, reward sources) for a
    mapping their config refuses. With the model that was validated, an unknown key names the nearest known one."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in (*path, *err["loc"]))
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and model is not None:
        known = field_names_at(model, err["loc"][:-1])
        nearest = difflib.get_close_matches(str(err["loc"][-1]), known, n=1, cutoff=0.6)
        message = f"unknown key; did you mean {nearest[0]!r}?" if nearest else f"unknown key; known: {', '.join(known)}"
    return f"{where}: {message}" if where else message


def field_names_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model that `loc` (a validation error's location, less its last key) leads to from
    `model`, through nested models, optionals, lists (an index) and mappings (a key); [] where it cannot tell."""
    current: Any = model
    for part in loc:
        if typing.get_origin(current) in (list, dict):  # the part is an index or a key: on to the items' type
            current = _model_inside(typing.get_args(current)[-1])
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_inside(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _model_inside(annotation: Any) -> Any:
    """The one type an annotation holds (X, X | None, Annotated[X, ...]): a model, a list or a mapping of
    them (the error location carries the index or key to walk past), or the annotation itself."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is Annotated:
        return _model_inside(args[0])
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return _model_inside(args[0])
    return annotation
