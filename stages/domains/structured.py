"""Structured output: answer with a JSON object that satisfies a JSON Schema, including required values.

The prompt is a compact schema, one field per comma: name, type and either a required value or a range.

    JSON: id int 7, word str 7, x bool true   ->   {"id": 7, "word": "7", "x": true}
    JSON: age int 2-5, note list 3 4          ->   {"age": 3, "note": [3, 4]}

The types are the lesson (`str 7` is the string "7", `int 7` the number 7); ranges leave the value free within
bounds; lists are integer arrays. Ranges and lists appear only with two fields (three would pass 40 tokens).
2-3 fields from 12 keys and 200-400 values per field give well over 10^6 distinct problems; the split key is
the prompt.

Grading (reward = eval metric): the first JSON value in the completion (```json fences and text around it are
tolerated), validated with `jsonschema` (Draft 2020-12) against the item's schema: object, exactly the listed
keys (`required` + `additionalProperties: false`), each with its type, and each required value as `const`
(jsonschema's `const` keeps true and 1 apart; 7.0 counts as the integer 7, as JSON Schema says). Public
structured-output benchmarks (e.g. JSONSchemaBench) score schema validity alone; we also demand the values,
which is what "fill this form from the request" needs and what makes an empty-but-valid answer fail.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from cascade.stages.domains.base import Domain, Item

KEYS = ("id", "n", "x", "age", "day", "city", "page", "line", "note", "word", "song", "star")  # 1-2 tokens each
WORDS = (
    "sun",
    "rain",
    "blue",
    "sea",
    "book",
    "tree",
    "cat",
    "dog",
    "snow",
    "fire",
    "gold",
    "star",
    "moon",
    "ice",
    "salt",
    "milk",
    "cup",
    "bell",
    "road",
)
KINDS = ("int", "str", "bool", "range", "list")
_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def sample_field(rng: random.Random, kinds: tuple[str, ...] = KINDS) -> tuple[str, dict[str, Any], Any]:
    """(prompt text after the key, its JSON Schema, the oracle's value)."""
    kind = rng.choice(kinds)
    if kind == "int":
        v = rng.randint(0, 99)
        return f"int {v}", {"type": "integer", "const": v}, v
    if kind == "str":
        # Digit strings make the type matter: `str 7` must be "7", not 7.
        v = rng.choice(WORDS) if rng.random() < 0.6 else str(rng.randint(0, 99))
        return f"str {v}", {"type": "string", "const": v}, v
    if kind == "bool":
        v = rng.random() < 0.5
        return f"bool {json.dumps(v)}", {"type": "boolean", "const": v}, v
    if kind == "range":
        lo = rng.randint(0, 8)
        hi = rng.randint(lo + 1, 9)
        return f"int {lo}-{hi}", {"type": "integer", "minimum": lo, "maximum": hi}, rng.randint(lo, hi)
    v = [rng.randint(0, 9) for _ in range(rng.randint(1, 2))]
    return "list " + " ".join(map(str, v)), {"type": "array", "items": {"type": "integer"}, "const": v}, v


def first_json(text: str) -> Any:
    """The first JSON value in `text` (inside a ```json fence if there is one), or None."""
    fenced = _FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    text = text.strip()
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch in "{["):
        try:
            return decoder.raw_decode(text, start)[0]
        except (json.JSONDecodeError, RecursionError):
            continue
    return None


class StructuredDomain(Domain):
    name = "structured"

    def sample(self, rng: random.Random) -> Item:
        keys = rng.sample(KEYS, rng.choice((2, 2, 3)))
        kinds = KINDS if len(keys) == 2 else KINDS[:3]  # three fields with ranges or lists would pass 40 tokens
        fields = [(k, *sample_field(rng, kinds)) for k in keys]
        prompt = "JSON: " + ", ".join(f"{k} {text}" for k, text, _, _ in fields)
        schema = {
            "type": "object",
            "properties": {k: s for k, _, s, _ in fields},
            "required": list(keys),
            "additionalProperties": False,
        }
        reference = json.dumps({k: v for k, _, _, v in fields})
        return Item(self.name, "", prompt, reference, {"schema": schema})

    def grade(self, item: Item, completion: str) -> float:
        value = first_json(completion)
        if value is None:
            return 0.0
        from jsonschema import Draft202012Validator  # on first grade: recipe validation loads every domain

        return float(Draft202012Validator(item.meta["schema"]).is_valid(value))
