"""Structured domain: the oracle's JSON validates, wrong types, values, keys or shapes do not."""

import json

from jsonschema import Draft202012Validator

from cascade.stages.domains import get_domain
from cascade.stages.domains.structured import first_json

STRUCTURED = get_domain("structured")


def test_oracle_passes_and_schemas_are_valid():
    items = STRUCTURED.generate("train", 200, seed=0)
    for item in items:
        Draft202012Validator.check_schema(item.meta["schema"])
        assert STRUCTURED.grade(item, item.reference) == 1.0
        assert STRUCTURED.grade(item, f"```json\n{item.reference}\n```") == 1.0


def corruptions(reference: str) -> list[str]:
    obj = json.loads(reference)
    key = next(iter(obj))
    value = obj[key]
    wrong_type = str(value).lower() if not isinstance(value, str) else (int(value) if value.isdigit() else 7)
    wrong_value = (
        (not value)
        if isinstance(value, bool)
        else (value + [1] if isinstance(value, list) else (value + "x" if isinstance(value, str) else value + 100))
    )
    return [
        json.dumps({**obj, key: wrong_type}),
        json.dumps({**obj, key: wrong_value}),
        json.dumps({k: v for k, v in obj.items() if k != key}),  # a required key missing
        json.dumps({**obj, "extra": 1}),  # no other keys allowed
        json.dumps([obj]),  # not an object
        reference[:-1],  # truncated
        "",
    ]


def test_corrupted_answers_fail():
    items = STRUCTURED.generate("train", 200, seed=0)
    for item in items:
        for bad in corruptions(item.reference):
            assert STRUCTURED.grade(item, bad) == 0.0, (item.prompt, bad)


def test_types_ranges_and_booleans_are_strict():
    item = next(it for it in STRUCTURED.generate("train", 500, seed=1) if "int " in it.prompt and "-" in it.prompt)
    key, lo_hi = next((k, s) for k, s in item.meta["schema"]["properties"].items() if "minimum" in s)
    obj = json.loads(item.reference)
    assert STRUCTURED.grade(item, json.dumps({**obj, key: lo_hi["minimum"]})) == 1.0
    assert STRUCTURED.grade(item, json.dumps({**obj, key: lo_hi["maximum"]})) == 1.0
    assert STRUCTURED.grade(item, json.dumps({**obj, key: lo_hi["maximum"] + 1})) == 0.0
    assert STRUCTURED.grade(item, json.dumps({**obj, key: True})) == 0.0  # a boolean is not an integer


def test_first_json_tolerates_text_around_it():
    assert first_json('Here you go: {"a": 1} hope it helps') == {"a": 1}
    assert first_json('```json\n{"a": [1, 2]}\n```') == {"a": [1, 2]}
    assert first_json("no json here") is None
    assert first_json('{"a": 1') is None


def test_heldout_split_is_large_disjoint_and_deterministic():
    train = STRUCTURED.generate("train", 3000, seed=0)
    heldout = STRUCTURED.generate("heldout", 300, seed=0)
    assert len({it.prompt for it in heldout}) == 300
    assert not {it.prompt for it in train} & {it.prompt for it in heldout}
    assert STRUCTURED.generate("heldout", 300, seed=0) == heldout
