"""A recipe file read whole and bounded: where a recipe name or path points (the shipped recipes are package data),
and its YAML parsed into the raw mapping `stages/recipe/schema.py` validates, refusing in one line what would hang or
overflow the stack (a huge file, a FIFO or a device, deep nesting, a recursive or exploding alias).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cascade.artifacts.user_files import UnreadableFile, read_user_file
from cascade.stages.errors import RecipeError

# The shipped recipes are package data: a checkout, an editable install and a wheel all find them here.
RECIPES_DIR = Path(str(resources.files("cascade.recipes")))
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; a bigger file is not one
# A recipe nests a handful of levels and holds hundreds of values. An alias counts once per use: a 520-byte
# "billion laughs" file expands to 10^9 values, and a recursive alias or 5,000 levels overflow Python's stack.
MAX_YAML_DEPTH = 64
MAX_YAML_VALUES = 100_000


def resolve_recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise RecipeError(f"recipe file not found: {path}")
        return path
    shipped = RECIPES_DIR / f"{name_or_path}.yaml"
    if not shipped.exists():
        known = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
        raise RecipeError(f"unknown recipe {name_or_path!r}; shipped recipes: {known}")
    return shipped


def read_recipe_file(path: Path) -> dict[str, Any]:
    """The raw mapping of a recipe file, named after the file unless it names itself."""
    raw = parse_recipe_text(read_recipe_bytes(path), str(path))
    raw.setdefault("name", path.stem)
    return raw


def read_recipe_bytes(location: str | Path) -> bytes:
    """A recipe file's bytes, from a path or a `file://` URI: a directory, a FIFO or a device (/dev/zero) is
    refused without being read, and a longer file than MAX_RECIPE_BYTES once one byte past it has been read."""
    try:
        return read_user_file(location, MAX_RECIPE_BYTES, what="recipe")
    except UnreadableFile as e:
        raise RecipeError(str(e)) from None


def parse_recipe_text(data: bytes, source: str) -> dict[str, Any]:
    if len(data) > MAX_RECIPE_BYTES:  # a caller's own reader of a recipe URI may not bound what it read
        raise RecipeError(f"recipe {source} is larger than {MAX_RECIPE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"recipe {source} is not UTF-8 text") from None
    try:
        raw = load_bounded_yaml(text, source)
    except yaml.YAMLError as e:
        raise RecipeError(f"{source}: not valid YAML{yaml_error_position(e)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: a recipe is a mapping of sections, not a {type(raw).__name__}")
    return raw


def yaml_error_position(e: yaml.YAMLError) -> str:
    """` at line L, column C: <problem> (<context>)` of a YAML syntax error (1-based, as editors count), or its
    first line where it has no position."""
    # a MarkedYAMLError's; a plain YAMLError has none
    mark, problem, context = getattr(e, "problem_mark", None), getattr(e, "problem", None), getattr(e, "context", None)
    if mark is None:
        return f": {str(e).splitlines()[0]}"
    return f" at line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


class _DepthBoundLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than MAX_YAML_DEPTH while composing, which recurses per level."""

    depth = 0
    source = "recipe"

    def compose_node(self, parent: Any, index: Any) -> Any:
        self.depth += 1
        try:
            if self.depth > MAX_YAML_DEPTH:
                raise RecipeError(f"{self.source}: nested deeper than {MAX_YAML_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_bounded_yaml(text: str, source: str) -> Any:
    """yaml.safe_load, refusing in one line what would hang or overflow the stack: deep nesting, a recursive
    alias, or aliases that expand past MAX_YAML_VALUES values. The node graph is checked before it is built."""
    loader = _DepthBoundLoader(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, 1, {}, set(), source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(
    node: yaml.Node, depth: int, sizes: dict[int, tuple[int, int]], open_: set[int], source: str
) -> tuple[int, int]:
    """(values, height) of `node` with every alias expanded; an alias is the node it names, so sizes are memoized
    per node and a node met again on its own path is a recursive alias."""
    if depth > MAX_YAML_DEPTH:
        raise RecipeError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels (aliases expanded)")
    if id(node) in open_:
        raise RecipeError(f"{source}: an alias refers to a node that contains it (a recursive structure)")
    if id(node) not in sizes:
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        open_.add(id(node))
        values, height = 1, 1
        for child in children:
            child_values, child_height = _expanded_size(child, depth + 1, sizes, open_, source)
            values, height = values + child_values, max(height, child_height + 1)
            if values > MAX_YAML_VALUES:
                raise RecipeError(f"{source}: aliases expand to more than {MAX_YAML_VALUES} values")
        open_.discard(id(node))
        sizes[id(node)] = values, height
    values, height = sizes[id(node)]
    if depth + height - 1 > MAX_YAML_DEPTH:
        raise RecipeError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels (aliases expanded)")
    return values, height
