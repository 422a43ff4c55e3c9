"""Tool calls read out of a completion and graded BFCL-style by structure, never by running them: the tool domain's
grader (stages/domains/tool.py), for RL rewards and evals alike.

Accepted completion formats (both for synthetic and real items; a ```json/```python fence is stripped):
- JSON: one object `{"name": ..., "arguments": {...}}` or a list of them (`"arguments"` may be a JSON-encoded
  string, as OpenAI-style tool calls carry it; `"parameters"` is accepted as its alias); `[]` is no call.
- Python call syntax, parsed with `ast` (never run): `f(a=1, b="x")` or `[f(a=1), g.h(b=[1, 2])]`. Keyword
  arguments only; literal values are read with `ast.literal_eval`, any other expression (a variable like
  `data['sales']`) becomes its source text, which is how BFCL's possible answers write variables.
Anything else decodes to no call.

Grading (the same for reward and eval), after BFCL's AST checker:
- the number of calls equals the number of expected calls, and each expected call is matched by a distinct
  call in any order (parallel categories);
- a call matches when its name is the expected one (dots may be written as underscores, as BFCL allows for
  models whose tool names cannot contain dots), it passes no parameter outside the expected ones, every
  parameter it leaves out allows "" (BFCL's mark for "may be omitted"), each value has the documented type
  (integer: int; float: int or float; boolean, string, array/tuple, dict; any: anything) or, as BFCL's
  checker allows, the type of the possible answer's first non-"" option (an explicit null where the answer
  lists None), and equals one of the allowed values. Strings compare case-insensitively ignoring spaces and
  `,./-_*^`; lists element by element; dicts key by key against their own allowed lists. A string passed for
  a non-string parameter (at any depth) counts as a variable reference and is compared by value only: BFCL's
  answers write variables as source text (parallel_multiple_21), and one answer lists strings for an integer
  array (parallel_multiple_94);
- irrelevance: pass when the completion decodes to no call.
Deviations from BFCL: one grader for all completions (BFCL decodes each model with its own handler: we accept
the two formats above); no per-error-type diagnostics, only the 0/1 score; a parameter whose possible answer
is an empty list of options (live_simple_106-63-0 and 112-68-0, where an empty array is meant) accepts an
empty array or its omission, where a literal reading would make those rows unsolvable.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_]*[ \t]*\n(.*?)(?:```|\Z)", re.S)
_IGNORED_IN_STRINGS = re.compile(r"[\s,./\-_*^]")


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]


# --------------------------------------------------------------------------- decoding completions


def decode_calls(completion: str) -> list[Call] | None:
    """The calls a completion makes, [] for an explicit empty list, None when it is no call at all."""
    fenced = _FENCE.search(completion)
    text = (fenced.group(1) if fenced else completion).strip()
    if not text:
        return None
    value = _json_value(text)
    calls = _calls_from_json(value) if value is not None else None
    # JSON found inside Python call syntax (`f(a={"k": 1})`) is not a call list: then read it as Python.
    return calls if calls is not None else _calls_from_python(text)


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        pass
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text, start)[0]
    except (json.JSONDecodeError, RecursionError):
        return None


def _calls_from_json(value: Any) -> list[Call] | None:
    entries = value if isinstance(value, list) else [value]
    calls = []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            return None
        args = entry.get("arguments", entry.get("parameters", {}))
        if isinstance(args, str):  # OpenAI-style: the arguments object JSON-encoded
            try:
                args = json.loads(args)
            except (json.JSONDecodeError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        calls.append(Call(entry["name"], args))
    return calls


def _calls_from_python(text: str) -> list[Call] | None:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for node in nodes:
        name = _dotted_name(node.func) if isinstance(node, ast.Call) else None
        if name is None or node.args or any(k.arg is None for k in node.keywords):
            return None  # BFCL calls are keyword-only; positional or **kwargs cannot be matched by name
        try:
            args = {k.arg: _literal_or_source(k.value) for k in node.keywords}
        except (RecursionError, MemoryError):
            return None
        calls.append(Call(name, args))
    return calls


def _literal_or_source(node: ast.expr) -> Any:
    """A literal's value; any other expression (a variable such as `data['sales']`) as its source text, which
    is how BFCL's possible answers write variables."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return ast.unparse(node)


def _dotted_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_name(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


# --------------------------------------------------------------------------- the BFCL-style checker


def check_calls(calls: list[Call] | None, functions: list[dict], expected: list[dict], category: str) -> bool:
    """Whether `calls` answer the item: see the module docstring."""
    if category == "irrelevance":
        return not calls
    if not calls or len(calls) != len(expected):
        return False
    docs = {f["name"]: f for f in functions}
    return _match_all(calls, expected, docs, used=frozenset())


def _match_all(calls: list[Call], expected: list[dict], docs: dict, used: frozenset) -> bool:
    """Backtracking assignment of expected calls to distinct actual calls (BFCL's any-order matching)."""
    if not expected:
        return True
    ((name, allowed),) = expected[0].items()
    for i, call in enumerate(calls):
        if i not in used and call_matches(call, name, allowed, docs.get(name)):
            if _match_all(calls, expected[1:], docs, used | {i}):
                return True
    return False


def call_matches(call: Call, name: str, allowed: dict[str, list], doc: dict | None) -> bool:
    if call.name not in (name, name.replace(".", "_")):
        return False
    props = (doc or {}).get("parameters", {}).get("properties", {})
    # An empty option list (two live_simple rows) stands for an empty array; we also let it be left out.
    allowed = {arg: options or [[], ""] for arg, options in allowed.items()}
    for arg, value in call.arguments.items():
        if arg not in allowed:
            return False  # a parameter the answer does not have
        if not type_ok(value, props.get(arg, {})) and not answer_typed(value, allowed[arg]):
            return False
        if not any(value_matches(value, option) for option in allowed[arg]):
            return False
    return all("" in options for arg, options in allowed.items() if arg not in call.arguments)


def type_ok(value: Any, schema: dict) -> bool:
    """Whether `value` has the documented type. A string is always let through: where another type is
    documented it is a variable reference (`x=data['sales']`), which BFCL's answers write as source text, so
    the value check decides (a "5" for an integer still fails there, against the option 5)."""
    kind = schema.get("type")
    if isinstance(value, str):
        return True
    if kind == "integer":
        return type(value) is int
    if kind in ("float", "number"):
        return type(value) in (int, float)  # BFCL accepts an int where a float is documented
    if kind == "boolean":
        return type(value) is bool
    if kind == "string":
        return isinstance(value, str)
    if kind in ("array", "tuple"):
        items = schema.get("items")
        return isinstance(value, (list, tuple)) and (not items or all(type_ok(v, items) for v in value))
    if kind in ("dict", "object"):
        props = schema.get("properties", {})
        return isinstance(value, dict) and all(type_ok(v, props[k]) for k, v in value.items() if k in props)
    return True  # "any", or a type BFCL does not document: the value check alone decides


def answer_typed(value: Any, options: list) -> bool:
    """BFCL's variable rule: a value of the type of the possible answer's first non-"" option passes the type
    check whatever the documented type (an explicit null where the answer lists None: parallel_152,
    live_simple_30-8-0; True for a string-typed `venue` whose answer is True: simple_python_307)."""
    typed = next((o for o in options if o != ""), "")
    return typed != "" and type(value) is type(typed)


def value_matches(value: Any, option: Any) -> bool:
    """One allowed value of a possible answer; dicts inside it map keys to their own lists of options."""
    if isinstance(option, dict):
        if not isinstance(value, dict) or set(value) - set(option):
            return False
        return all(
            any(value_matches(value[k], o) for o in opts) if k in value else "" in opts for k, opts in option.items()
        )
    if isinstance(option, list):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(option)
            and all(value_matches(v, o) for v, o in zip(value, option))
        )
    if isinstance(option, bool) or isinstance(value, bool):
        return type(value) is bool and type(option) is bool and value == option
    if isinstance(option, str):
        return isinstance(value, str) and normalize(value) == normalize(option)
    if isinstance(option, (int, float)):
        return type(value) in (int, float) and value == option
    return value == option


def normalize(text: str) -> str:
    return _IGNORED_IN_STRINGS.sub("", text).lower().replace("'", '"')
