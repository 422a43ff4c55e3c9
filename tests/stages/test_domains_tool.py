"""Tool domain: BFCL-style matching of calls, on synthetic items and on every row of the real BFCL files."""

import json

import pytest

from cascade.stages.domains import get_domain
from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
from cascade.stages.domains.tool import reference_calls
from cascade.stages.domains.tool_calls import Call, decode_calls

TOOL = get_domain("tool")
CALL_CATEGORIES = ["bfcl_simple", "bfcl_multiple", "bfcl_parallel", "bfcl_parallel_multiple", "bfcl_live_simple"]
EXPECTED_ROWS = {
    "bfcl_simple": 400,
    "bfcl_multiple": 200,
    "bfcl_parallel": 200,
    "bfcl_parallel_multiple": 200,
    "bfcl_live_simple": 258,
    "bfcl_irrelevance": 240,
}


def as_python(calls_json: str) -> str:
    calls = json.loads(calls_json)
    text = ", ".join(f"{c['name']}({', '.join(f'{k}={v!r}' for k, v in c['arguments'].items())})" for c in calls)
    return f"[{text}]"


def corrupt(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1000
    if isinstance(value, str):
        return value + " zzz"
    if isinstance(value, list):
        return value + ["zzz"]
    return {**value, "zzz": 1}


def corrupted(calls_json: str) -> str:
    """The first argument of the first call changed; a call without arguments gets an unexpected one."""
    calls = json.loads(calls_json)
    args = calls[0]["arguments"]
    if args:
        key = next(iter(args))
        args[key] = corrupt(args[key])
    else:
        args["zzz_unexpected"] = 1
    return json.dumps(calls)


@pytest.fixture(scope="module")
def bfcl():
    loaders = TOOL.benchmarks()
    assert set(loaders) == set(EXPECTED_ROWS)
    return {name: loaders[name](DEFAULT_DATA_ROOT) for name in loaders}


@pytest.mark.parametrize("name", CALL_CATEGORIES)
def test_every_bfcl_possible_answer_matches_and_a_corrupted_argument_fails(bfcl, name):
    items = bfcl[name]
    assert len(items) == EXPECTED_ROWS[name]
    for item in items:
        expected = item.meta["ground_truth"]
        assert TOOL.grade(item, item.reference) == 1.0, item.id
        assert TOOL.grade(item, reference_calls(expected, omit_optional=True)) == 1.0, item.id
        assert TOOL.grade(item, as_python(item.reference)) == 1.0, item.id
        assert TOOL.grade(item, corrupted(item.reference)) == 0.0, item.id
        assert TOOL.grade(item, "[]") == 0.0, item.id


@pytest.mark.parametrize("name", ["bfcl_parallel", "bfcl_parallel_multiple"])
def test_parallel_calls_match_in_any_order_but_not_twice(bfcl, name):
    for item in bfcl[name][:50]:
        calls = json.loads(item.reference)
        assert TOOL.grade(item, json.dumps(calls[::-1])) == 1.0, item.id
        assert TOOL.grade(item, json.dumps(calls[:1] * len(calls))) == 0.0, item.id
        assert TOOL.grade(item, json.dumps(calls[:-1])) == 0.0, item.id


def test_irrelevance_passes_only_without_a_call(bfcl):
    items = bfcl["bfcl_irrelevance"]
    for item in items:
        name = item.meta["functions"][0]["name"]
        assert TOOL.grade(item, "[]") == 1.0
        assert TOOL.grade(item, "None of these functions can do that.") == 1.0
        assert TOOL.grade(item, json.dumps([{"name": name, "arguments": {}}])) == 0.0
        assert TOOL.grade(item, f"{name}()") == 0.0


def test_synthetic_oracle_passes_and_wrong_calls_fail():
    items = TOOL.generate("train", 200, seed=0)
    for item in items:
        call = json.loads(item.reference)
        other = next(f["name"] for f in item.meta["functions"] if f["name"] != call["name"])
        assert TOOL.grade(item, item.reference) == 1.0
        assert TOOL.grade(item, f"[{item.reference}]") == 1.0
        assert TOOL.grade(item, as_python(f"[{item.reference}]")) == 1.0
        assert TOOL.grade(item, corrupted(f"[{item.reference}]")) == 0.0
        assert TOOL.grade(item, json.dumps({**call, "name": other})) == 0.0
        assert TOOL.grade(item, json.dumps([call, call])) == 0.0
        assert TOOL.grade(item, json.dumps({"name": call["name"], "arguments": {}})) == 0.0
        assert TOOL.grade(item, "") == 0.0


def test_optional_argument_may_only_be_omitted_when_not_asked_for():
    items = [it for it in TOOL.generate("train", 400, seed=0) if json.loads(it.reference)["name"] == "weather"]
    without_day = [it for it in items if "day" not in json.loads(it.reference)["arguments"]]
    with_day = [it for it in items if "day" in json.loads(it.reference)["arguments"]]
    assert without_day and with_day
    for item in without_day:
        call = json.loads(item.reference)
        assert TOOL.grade(item, json.dumps({**call, "arguments": {**call["arguments"], "day": "Mon"}})) == 0.0
    for item in with_day:
        call = json.loads(item.reference)
        assert TOOL.grade(item, json.dumps({**call, "arguments": {"city": call["arguments"]["city"]}})) == 0.0


def test_types_are_checked_and_strings_are_normalized():
    item = next(it for it in TOOL.generate("train", 400, seed=0) if json.loads(it.reference)["name"] == "add")
    a, b = (json.loads(item.reference)["arguments"][k] for k in "ab")
    assert TOOL.grade(item, f"add(a={a}, b={b})") == 1.0
    assert TOOL.grade(item, f'add(a="{a}", b={b})') == 0.0  # a string is not the integer
    assert TOOL.grade(item, f"add(a={a}.5, b={b})") == 0.0
    item = next(it for it in TOOL.generate("train", 400, seed=0) if json.loads(it.reference)["name"] == "play")
    song = json.loads(item.reference)["arguments"]["song"]
    assert TOOL.grade(item, f'play(song="  {song.upper()}.")') == 1.0  # case, spaces and dots are ignored


def test_decoding_formats():
    assert decode_calls('{"name": "f", "arguments": {"a": 1}}') == [Call("f", {"a": 1})]
    assert decode_calls('{"name": "f", "arguments": "{\\"a\\": 1}"}') == [Call("f", {"a": 1})]
    assert decode_calls('```json\n[{"name": "f", "parameters": {"a": 1}}]\n```') == [Call("f", {"a": 1})]
    assert decode_calls("[m.f(a=1, b=[1, 2]), g(c='x')]") == [Call("m.f", {"a": 1, "b": [1, 2]}), Call("g", {"c": "x"})]
    assert decode_calls("f(x=data['sales'])") == [Call("f", {"x": "data['sales']"})]
    assert decode_calls('f(a={"k": [1]}, b=[2])') == [Call("f", {"a": {"k": [1]}, "b": [2]})]
    assert decode_calls("[]") == []
    assert decode_calls("f(1, 2)") is None  # positional arguments cannot be matched by name
    assert decode_calls("I cannot help with that.") is None
    assert decode_calls('{"a": 1}') is None


def test_heldout_split_is_large_disjoint_and_deterministic():
    train = TOOL.generate("train", 3000, seed=0)
    heldout = TOOL.generate("heldout", 300, seed=0)
    assert len({it.prompt for it in heldout}) == 300
    assert not {it.prompt for it in train} & {it.prompt for it in heldout}
    assert TOOL.generate("heldout", 300, seed=0) == heldout
