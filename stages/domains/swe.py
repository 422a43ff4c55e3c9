"""SWE, agentless: a small multi-file repository with a failing test; localize the bug, answer with an edit.

Agentless repair (Xia et al., 2024, as Nemotron-Cascade's SWE RL uses it): the policy sees the repository and
the failing test, localizes the bug (the file, and the function in it) and answers with a search/replace edit
in the format coding assistants use:

    shop/rules.py
    <<<<<<< SEARCH
        return 5 if x > 3 else 2
    =======
        return 5 if x >= 3 else 2
    >>>>>>> REPLACE

The edit is applied to the repository and the tests run in the sandbox; the reward is execution-based. A
repository has `num_modules` modules of the `shop` package (default 2) holding `num_functions` one-line
functions between them (default 5), and `tests/test_shop.py`, which imports the buggy function from its module
and fails on it. One function has a bug of one of two families, each fixed by one regular edit so that a ~3M
model can learn the repair in minutes:
- boundary (off-by-one at a comparison): `>` where `>=` was meant, or the reverse; the failing test sits on the
  boundary;
- sign (wrong operator): `x * a - b` where `x * a + b` was meant, or the reverse.
The other functions are correct and look alike, so localization is part of the task: the test's import names
the module, the module holds several candidates.

Grading: parse the edit; a malformed one scores 0 and says why (`grade_details` -> "malformed"; the eval reports
`malformed_rate`): no edit block, a file that is not in the repository, or a SEARCH text that is not found
exactly once in it. Then the edited repository runs in the sandbox: its modules are built in memory, the shown
test runs, then hidden tests of every function (the fixed one around its boundary, the others at a few inputs:
an edit that breaks a correct function fails, as PASS_TO_PASS does in SWE-bench). When every function of the
edited repository is a one-line integer expression, `stages.domains.code.host_check` interprets them instead,
with the same verdict and no process. Deviations from SWE-bench: generated repositories of a few lines, one
hunk per answer, and search/replace edits only (no unified diffs).
"""

from __future__ import annotations

import ast
import random
import re
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.code import SYNTHETIC_LIMITS, Job, host_check, int_tests, run_jobs

TOGGLE_STRICT = {">": ">=", ">=": ">", "<": "<=", "<=": "<"}
COMPARE = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}
SIGN_INPUTS = (-3, 0, 1, 2, 5, 9)
MODULES = ("shop/rules.py", "shop/prices.py")
TEST_FILE = "tests/test_shop.py"
FUNCTION_NAMES = ("discount", "bonus", "shipping", "tax", "fee", "rebate", "points", "level", "rank", "tier")
EDIT = re.compile(
    r"^(?P<path>[\w./-]+)\n<<<<<<< SEARCH\n(?P<search>.*?)\n=======\n(?P<replace>.*?)\n>>>>>>> REPLACE", re.S | re.M
)


def boundary_body(rng: random.Random) -> tuple[str, str, list[list[int]], list[int]]:
    """(buggy body, fixed body, hidden cases, the shown failing test as [input, expected])."""
    right = rng.choice(sorted(COMPARE))
    c, then = rng.randint(0, 9), rng.randint(0, 9)
    other = rng.choice([v for v in range(10) if v != then])
    body = "{t} if x {op} {c} else {e}"
    buggy = body.format(t=then, op=TOGGLE_STRICT[right], c=c, e=other)
    fixed = body.format(t=then, op=right, c=c, e=other)
    cases = [[x, then if COMPARE[right](x, c) else other] for x in range(c - 3, c + 4)]
    return buggy, fixed, cases, cases[3]  # cases[3] is x == c, where strict and non-strict disagree


def sign_body(rng: random.Random) -> tuple[str, str, list[list[int]], list[int]]:
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    right = rng.choice("+-")
    wrong = "-" if right == "+" else "+"
    value = (lambda x: a * x + b) if right == "+" else (lambda x: a * x - b)
    shown = rng.randint(0, 9)  # b > 0, so the buggy function fails at every input
    cases = [[x, value(x)] for x in sorted(set(SIGN_INPUTS) | {shown})]
    return f"x * {a} {wrong} {b}", f"x * {a} {right} {b}", cases, [shown, value(shown)]


def correct_body(rng: random.Random) -> tuple[str, list[list[int]]]:
    """A correct decoy of either family's shape (what it computes is what it is meant to), and its cases."""
    body = (sign_body if rng.random() < 0.5 else boundary_body)(rng)[0]
    return body, [[x, eval(body, {"__builtins__": {}}, {"x": x})] for x in SIGN_INPUTS]  # our own int expression


def _function(name: str, body: str) -> str:
    return f"def {name}(x):\n    return {body}\n"


def make_repository(rng: random.Random, num_modules: int = 2, num_functions: int = 5) -> dict[str, Any]:
    """Files, the buggy function's place and fix, and the hidden cases of every function."""
    modules = MODULES[:num_modules]
    names = rng.sample(FUNCTION_NAMES, num_functions)
    family = "sign" if rng.random() < 0.3 else "boundary"
    buggy, fixed, cases, shown = (sign_body if family == "sign" else boundary_body)(rng)
    bug_module = rng.choice(modules)
    functions: dict[str, list[tuple[str, str, list[list[int]]]]] = {m: [] for m in modules}
    functions[bug_module].append((names[0], buggy, cases))
    bodies = {buggy, fixed}  # every line distinct: the fix's SEARCH text occurs exactly once
    for i, name in enumerate(names[1:]):
        body, decoy_cases = correct_body(rng)
        while body in bodies:
            body, decoy_cases = correct_body(rng)
        bodies.add(body)
        functions[modules[i % num_modules]].append((name, body, decoy_cases))
    for module in modules:
        rng.shuffle(functions[module])
    files = {m: "\n".join(_function(n, b) for n, b, _ in functions[m]) for m in modules}
    package = bug_module.removesuffix(".py").replace("/", ".")
    x, want = shown
    files[TEST_FILE] = (
        f"from {package} import {names[0]}\n\n\ndef test_{names[0]}():\n    assert {names[0]}({x}) == {want}\n"
    )
    hidden = {m: [[n, c] for n, _, c in functions[m]] for m in modules}
    return {
        "files": files,
        "family": family,
        "bug_file": bug_module,
        "bug_function": names[0],
        "search": f"    return {buggy}",
        "replace": f"    return {fixed}",
        "hidden": hidden,
    }


def render_prompt(files: dict[str, str], test: str) -> str:
    listing = "".join(f"--- {path}\n{text.rstrip()}\n" for path, text in files.items())
    return f"{listing}FAILED {TEST_FILE}::{test}\nFix the bug with one SEARCH/REPLACE edit."


def render_edit(path: str, search: str, replace: str) -> str:
    return f"{path}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def apply_edit(files: dict[str, str], completion: str) -> tuple[dict[str, str] | None, str | None]:
    """(the edited files, None), or (None, why the edit is malformed)."""
    found = EDIT.search(completion)
    if found is None:
        return None, "no SEARCH/REPLACE block"
    path, search, replace = found.group("path"), found.group("search"), found.group("replace")
    if path not in files:
        return None, f"no file {path} in the repository"
    count = files[path].count(search)
    if count != 1:
        return None, "SEARCH text not found" if count == 0 else "SEARCH text found more than once"
    return {**files, path: files[path].replace(search, replace, 1)}, None


def repository_program(files: dict[str, str], hidden: dict[str, list]) -> str:
    """A program that builds the repository's modules in memory, runs the test file's tests, then the hidden
    cases of every function; it exits 0 only if all pass."""
    return (
        "import sys, types\n"
        f"_files = {files!r}\n"
        "for _path, _src in _files.items():\n"
        "    if _path.startswith('tests/'):\n"
        "        continue\n"
        "    _name = _path[:-3].replace('/', '.')\n"
        "    _pkg, _leaf = _name.rsplit('.', 1)\n"
        "    if _pkg not in sys.modules:\n"
        "        sys.modules[_pkg] = types.ModuleType(_pkg)\n"
        "        sys.modules[_pkg].__path__ = []\n"
        "    _mod = types.ModuleType(_name)\n"
        "    exec(compile(_src, _path, 'exec'), _mod.__dict__)\n"
        "    sys.modules[_name] = _mod\n"
        "    setattr(sys.modules[_pkg], _leaf, _mod)\n"
        f"_tests = {{}}\nexec(compile(_files[{TEST_FILE!r}], {TEST_FILE!r}, 'exec'), _tests)\n"
        "for _fn in [v for k, v in _tests.items() if k.startswith('test_')]:\n"
        "    _fn()\n"
        + "".join(
            f"from {m.removesuffix('.py').replace('/', '.')} import {name}\n{int_tests(name, cases)}"
            for m, fns in hidden.items()
            for name, cases in fns
        )
    )


def fast_verdict(files: dict[str, str], hidden: dict[str, list]) -> float | None:
    """host_check on every function when each is a one-line int expression; None: the sandbox decides."""
    verdicts = []
    for module, fns in hidden.items():
        try:
            tree = ast.parse(files[module])
        except SyntaxError:
            return None
        defs = {
            node.name: ast.get_source_segment(files[module], node)
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
        }
        if len(defs) != len(tree.body):
            return None
        for name, cases in fns:
            verdicts.append(host_check(defs[name], name, cases) if name in defs else 0.0)
    return None if None in verdicts else min(verdicts)


def edited_job(files: dict[str, str] | None, hidden: dict[str, list], fast: bool = True) -> Job:
    """The grading job of an edited repository (None: a malformed edit, score 0): the fast path when it applies,
    else the repository's program in the sandbox."""
    if files is None:
        return Job(score=0.0)
    verdict = fast_verdict(files, hidden) if fast else None
    if verdict is not None:
        return Job(score=verdict)
    return Job(repository_program(files, hidden), SYNTHETIC_LIMITS)


class SWEDomain(Domain):
    name = "swe"

    def __init__(self, num_modules: int = 2, num_functions: int = 5):
        if not 1 <= num_modules <= len(MODULES):
            raise ValueError(f"num_modules must be in 1..{len(MODULES)}")
        if not num_modules <= num_functions <= len(FUNCTION_NAMES):
            raise ValueError(f"num_functions must be in num_modules..{len(FUNCTION_NAMES)}")
        self.num_modules = num_modules
        self.num_functions = num_functions

    def sample(self, rng: random.Random) -> Item:
        repo = make_repository(rng, self.num_modules, self.num_functions)
        meta = {k: repo[k] for k in ("files", "family", "bug_file", "bug_function", "hidden")}
        reference = render_edit(repo["bug_file"], repo["search"], repo["replace"])
        return Item(
            self.name,
            "",
            render_prompt(repo["files"], f"test_{repo['bug_function']}"),
            reference,
            meta,
            split_key=repo["files"][repo["bug_file"]],
        )

    def grade(self, item: Item, completion: str) -> float:
        return self.grade_batch([item], [completion])[0]

    def grade_batch(self, items: list[Item], completions: list[str], fast: bool = True) -> list[float]:
        """`fast=False` sends every well-formed edit to the sandbox (tests compare the two paths)."""
        return run_jobs([self.job(it, c, fast) for it, c in zip(items, completions, strict=True)])

    def job(self, item: Item, completion: str, fast: bool = True) -> Job:
        return edited_job(apply_edit(item.meta["files"], completion)[0], item.meta["hidden"], fast)

    def grade_details(self, item: Item, completion: str) -> dict[str, Any]:
        files, malformed = apply_edit(item.meta["files"], completion)
        return {"score": run_jobs([edited_job(files, item.meta["hidden"])])[0], "malformed": malformed}

    def summarize_details(self, details: list[dict[str, Any]]) -> dict[str, float]:
        return {"malformed_rate": sum(d["malformed"] is not None for d in details) / max(1, len(details))}
