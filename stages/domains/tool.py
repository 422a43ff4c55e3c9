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

How completions are decoded and graded (both formats, BFCL's AST checker and where we deviate from it):
stages/domains/tool_calls.py.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import NativeBenchmark, read_jsonl
from cascade.stages.domains.tool_calls import check_calls, decode_calls

BFCL_FILES = {
    "bfcl_simple": "simple_python",
    "bfcl_multiple": "multiple",
    "bfcl_parallel": "parallel",
    "bfcl_parallel_multiple": "parallel_multiple",
    "bfcl_live_simple": "live_simple",
    "bfcl_irrelevance": "irrelevance",
}
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


def _bfcl_loader(stem: str) -> NativeBenchmark:
    def load(data_root: Path) -> list[Item]:
        return load_bfcl(data_root, stem)

    def parse_row(row: dict, index: int = 0) -> Item:
        """A user's row in BFCL's question format, with its possible answer under "ground_truth"."""
        return bfcl_item(row, _category(stem), row.get("ground_truth", []))

    load.__name__ = f"load_bfcl_{stem}"
    return NativeBenchmark(load, parse_row)


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
