"""Tool calling: answer a request with a function call, graded BFCL-style by structure, never by running it.

Synthetic items list two tools (the right one and a distractor, in random order) and a short request:

    weather(city,day) add(a,b)
    Add 23 and 45.                    ->   {"name": "add", "arguments": {"a": 23, "b": 45}}

Seven tools with integer, string and boolean arguments; `weather.day` is optional and must be left out when
the request names no day. 11,748 distinct requests x 6 distractors x 2 orders = 140,976 distinct prompts. The
split key is the prompt: which tools are offered is part of the problem. Requests of the small tools (12
light switches, 13 songs) therefore also occur in training with another distractor; the held-out score of
those measures choosing among a new pair of tools, not a new request.

As SFT conversations (`{kind: synthetic, conversations: true}`), an item continues after the call: the tool's
JSON result (`tool_exchange`, a pure function of the call) and an answer that reports it, so SFT also trains
what follows a tool turn. The first assistant turn is the reference call, which RL and the eval grade.

Real benchmarks (eval): BFCL v4 "simple" (simple_python), "multiple", "parallel", "parallel_multiple",
"live_simple" and "irrelevance", from `tool_calling/bfcl_v4/` and its `possible_answer/`. The prompt is the
conversation text, the function documents as JSON, and the answer format.

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
import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import read_jsonl

BFCL_FILES = {
    "bfcl_simple": "simple_python",
    "bfcl_multiple": "multiple",
    "bfcl_parallel": "parallel",
    "bfcl_parallel_multiple": "parallel_multiple",
    "bfcl_live_simple": "live_simple",
    "bfcl_irrelevance": "irrelevance",
}
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


# --------------------------------------------------------------------------- the synthetic generator

# Pools of words the tokenizer spends few tokens on: prompts must stay under 40 tokens with the chat template.
CITIES = (
    "Paris",
    "Nice",
    "Bath",
    "Bern",
    "Bonn",
    "Cork",
    "Dover",
    "Leeds",
    "Lima",
    "Lyon",
    "Milan",
    "Perth",
    "Pisa",
    "Turin",
)
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ROOMS = ("desk", "bed", "bath", "hall", "shop", "door")
SONGS = ("sun", "rain", "blue", "sea", "snow", "fire", "gold", "star", "moon", "ice", "salt", "milk", "bell")
FOODS = ("bread", "soup", "rice", "milk", "fish", "egg", "cake", "tea")


def _doc(name: str, description: str, params: dict[str, tuple[str, str]], required: list[str]) -> dict:
    """A function document in BFCL's shape, so synthetic and real items share one checker."""
    props = {p: {"type": t, "description": d} for p, (t, d) in params.items()}
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "dict", "properties": props, "required": required},
    }


TOOLS = {
    "weather": _doc(
        "weather",
        "Weather forecast for a city.",
        {"city": ("string", "City name."), "day": ("string", "Weekday; omit for today.")},
        ["city"],
    ),
    "add": _doc("add", "Add two integers.", {"a": ("integer", "First."), "b": ("integer", "Second.")}, ["a", "b"]),
    "ring": _doc("ring", "Set an alarm.", {"h": ("integer", "Hour 0-23."), "m": ("integer", "Minute.")}, ["h", "m"]),
    "nap": _doc("nap", "Start a timer.", {"n": ("integer", "Minutes.")}, ["n"]),
    "light": _doc(
        "light", "Switch a light.", {"room": ("string", "Room."), "on": ("boolean", "True: on.")}, ["room", "on"]
    ),
    "play": _doc("play", "Play a song.", {"song": ("string", "Song title.")}, ["song"]),
    "get": _doc("get", "Order food.", {"food": ("string", "What."), "n": ("integer", "How many.")}, ["food", "n"]),
}


def signature(doc: dict) -> str:
    """`name(a,b)`: no spaces, which saves the tokens that keep two of them plus a request under 40."""
    return f"{doc['name']}({','.join(doc['parameters']['properties'])})"


def sample_request(tool: str, rng: random.Random) -> tuple[str, dict[str, Any], dict[str, list]]:
    """(request text, the oracle's arguments, BFCL-style allowed values per parameter)."""
    if tool == "weather":
        city = rng.choice(CITIES)
        if rng.random() < 0.3:
            return f"Weather in {city}?", {"city": city}, {"city": [city], "day": [""]}
        day = rng.choice(DAYS)
        return f"Weather in {city} on {day}?", {"city": city, "day": day}, {"city": [city], "day": [day]}
    if tool == "add":
        args = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}
        text = f"Add {args['a']} and {args['b']}."
    elif tool == "ring":
        args = {"h": rng.randint(0, 23), "m": rng.randint(0, 59)}
        text = f"Ring at {args['h']}:{args['m']:02d}."
    elif tool == "nap":
        args = {"n": rng.randint(1, 99)}
        text = f"Nap {args['n']} min."
    elif tool == "light":
        args = {"room": rng.choice(ROOMS), "on": rng.random() < 0.5}
        text = f"{args['room'].capitalize()} light {'on' if args['on'] else 'off'}."
    elif tool == "play":
        args = {"song": rng.choice(SONGS)}
        text = f"Play {args['song']}."
    else:
        args = {"food": rng.choice(FOODS), "n": rng.randint(1, 9)}
        text = f"Get {args['n']} {args['food']}."
    return text, args, {k: [v] for k, v in args.items()}


class ToolDomain(Domain):
    name = "tool"

    def sample(self, rng: random.Random) -> Item:
        tool, distractor = rng.sample(sorted(TOOLS), 2)
        request, args, allowed = sample_request(tool, rng)
        listed = [TOOLS[tool], TOOLS[distractor]]
        rng.shuffle(listed)
        prompt = " ".join(signature(d) for d in listed) + "\n" + request
        reference = json.dumps({"name": tool, "arguments": args})
        meta = {"category": "multiple", "functions": listed, "ground_truth": [{tool: allowed}]}
        return Item(self.name, "", prompt, reference, meta)  # split key: the prompt (tools offered + request)

    def grade(self, item: Item, completion: str) -> float:
        m = item.meta
        return float(check_calls(decode_calls(completion), m["functions"], m["ground_truth"], m["category"]))

    def conversation(self, item: Item) -> list[dict[str, str]]:
        """The request, the call (the reference), the tool's result and the answer read from it."""
        call = json.loads(item.reference)
        result, answer = tool_exchange(call["name"], call["arguments"])
        return [
            {"role": "user", "content": item.prompt},
            {"role": "assistant", "content": item.reference},
            {"role": "tool", "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ]

    def benchmarks(self) -> dict[str, Callable[[Path], list[Item]]]:
        return {name: _bfcl_loader(stem) for name, stem in BFCL_FILES.items()}


SKIES = ("sun", "rain", "cloud", "snow")


def tool_exchange(tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(what the tool returns, the answer that reports it) for a synthetic call: a pure function of the call, so a
    conversation's later turns are as deterministic as its request."""
    if tool == "weather":
        seed = int.from_bytes(hashlib.sha256(f"{args['city']}:{args.get('day', '')}".encode()).digest()[:2], "big")
        sky, degrees = SKIES[seed % len(SKIES)], seed % 30
        when = f" on {args['day']}" if "day" in args else ""
        return {"sky": sky, "c": degrees}, f"{sky.capitalize()}, {degrees} C in {args['city']}{when}."
    if tool == "add":
        total = args["a"] + args["b"]
        return {"sum": total}, f"{args['a']} + {args['b']} = {total}."
    answers = {
        "ring": lambda a: f"Alarm set for {a['h']}:{a['m']:02d}.",
        "nap": lambda a: f"Timer set for {a['n']} min.",
        "light": lambda a: f"{a['room'].capitalize()} light {'on' if a['on'] else 'off'}.",
        "play": lambda a: f"Playing {a['song']}.",
        "get": lambda a: f"Ordered {a['n']} {a['food']}.",
    }
    return {"ok": True}, answers[tool](args)


# --------------------------------------------------------------------------- real BFCL files


def _bfcl_loader(stem: str) -> Callable[[Path], list[Item]]:
    def load(data_root: Path) -> list[Item]:
        return load_bfcl(data_root, stem)

    def parse_row(row: dict, index: int = 0) -> Item:
        """A user's row in BFCL's question format, with its possible answer under "ground_truth"."""
        return bfcl_item(row, _category(stem), row.get("ground_truth", []))

    load.__name__ = f"load_bfcl_{stem}"
    load.parse_row = parse_row  # type: ignore[attr-defined]  # used by stages/benchmarks.py for user files
    return load


def _category(stem: str) -> str:
    return stem.removesuffix("_python")  # simple_python -> simple


def load_bfcl(data_root: Path, stem: str) -> list[Item]:
    """Items of one BFCL v4 category; `meta` holds the function docs and the possible answers."""
    folder = data_root / "tool_calling" / "bfcl_v4"
    rows = read_jsonl(folder / f"BFCL_v4_{stem}.json")
    answers: dict[str, list] = {}
    if stem != "irrelevance":
        answers = {r["id"]: r["ground_truth"] for r in read_jsonl(folder / "possible_answer" / f"BFCL_v4_{stem}.json")}
    return [bfcl_item(row, _category(stem), answers.get(row["id"], [])) for row in rows]


def bfcl_item(row: dict, category: str, expected: list[dict]) -> Item:
    if category != "irrelevance" and not expected:
        raise ValueError(f"BFCL {category}: no possible answer for {row['id']}")
    meta = {"category": category, "functions": row["function"], "ground_truth": expected}
    prompt = bfcl_prompt(row["question"], row["function"])
    return Item("tool", row["id"], prompt, reference_calls(expected), meta, split_key=row["id"])


def bfcl_prompt(question: list[list[dict]], functions: list[dict]) -> str:
    turns = "\n".join(m["content"] for turn in question for m in turn)  # single-turn here: system + user
    return (
        f"{turns}\n\nFunctions (JSON):\n{json.dumps(functions)}\n\n"
        'Answer with the call(s) as a JSON list [{"name": ..., "arguments": {...}}], or [] if no function fits.'
    )


def reference_calls(expected: list[dict], omit_optional: bool = False) -> str:
    """The possible answer as a JSON list of calls: each parameter's first allowed value; a parameter whose
    options include "" (optional) is left out when that is its first option or when `omit_optional`."""
    calls = []
    for entry in expected:
        ((name, allowed),) = entry.items()
        args = {}
        for arg, options in allowed.items():
            if options and options[0] != "" and not (omit_optional and "" in options):
                args[arg] = concrete(options[0])
        calls.append({"name": name, "arguments": args})
    return json.dumps(calls)


def concrete(option: Any) -> Any:
    """A plain value from one allowed value: dicts inside it map keys to lists of options."""
    if isinstance(option, dict):
        return {k: concrete(opts[0]) for k, opts in option.items() if opts and opts[0] != ""}
    if isinstance(option, list):
        return [concrete(o) for o in option]
    return option
