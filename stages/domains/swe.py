"""SWE: agentless repair of a one-line bug, shown as the buggy function and the test it fails.

The prompt is the code and the failing assert, nothing else (the test is the issue report):

    def f(x):
        return 5 if x > 3 else 2
    assert f(3) == 5

and the answer is the whole fixed function (`... if x >= 3 else ...`). Two bug families, each fixed by one
regular edit so that a ~3M model can learn the repair in minutes rather than having to search for it:
- boundary (off-by-one at a comparison): a strict comparison where a non-strict one was meant, or the
  reverse; the failing test sits exactly on the boundary. 4 comparisons x 10 thresholds x 90 (then, else)
  value pairs = 3,600 distinct buggy functions.
- sign (wrong operator): `x * a - b` where `x * a + b` was meant, or the reverse. 2 x 8 x 9 = 144.
The split key is the buggy function, so the same bug with another failing input stays on one side; 388 of
the 3,744 are held out, so a held-out set of up to ~350 items can be drawn.

Grading: the fixed function plus hidden asserts over inputs around the boundary (or several inputs for the
sign family) that check `type(result) is int` and the value, then a random nonce printed last; the program
must exit 0 and print the nonce. This is `stages.domains.code`'s runner, including its host fast path: an
answer that is exactly `def f(x): return <int expression>` is scored by interpreting the expression, with
the same verdict and no process; anything else runs in the sandbox. Deviation from
SWE-bench: no repository, no patch format and no FAIL_TO_PASS/PASS_TO_PASS lists; the hidden tests play both
roles (the shown test must now pass and the function must be right everywhere else).
"""

from __future__ import annotations

import random

from stages.domains.base import Domain, Item
from stages.domains.code import extract_code, run_jobs, synthetic_job

TOGGLE_STRICT = {">": ">=", ">=": ">", "<": "<=", "<=": "<"}
COMPARE = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}
SIGN_INPUTS = (-3, 0, 1, 2, 5, 9)


def _function(body: str) -> str:
    return f"def f(x):\n    return {body}"


def boundary_bug(rng: random.Random) -> tuple[str, str, list[list[int]], list[int]]:
    """(buggy body, fixed body, hidden cases, the shown failing test as [input, expected])."""
    right = rng.choice(sorted(COMPARE))
    c, then = rng.randint(0, 9), rng.randint(0, 9)
    other = rng.choice([v for v in range(10) if v != then])
    body = "{t} if x {op} {c} else {e}"
    buggy = body.format(t=then, op=TOGGLE_STRICT[right], c=c, e=other)
    fixed = body.format(t=then, op=right, c=c, e=other)
    cases = [[x, then if COMPARE[right](x, c) else other] for x in range(c - 3, c + 4)]
    return buggy, fixed, cases, cases[3]  # cases[3] is x == c, where strict and non-strict disagree


def sign_bug(rng: random.Random) -> tuple[str, str, list[list[int]], list[int]]:
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    right = rng.choice("+-")
    wrong = "-" if right == "+" else "+"
    value = (lambda x: a * x + b) if right == "+" else (lambda x: a * x - b)
    shown = rng.randint(0, 9)  # b > 0, so the buggy function fails at every input
    cases = [[x, value(x)] for x in sorted(set(SIGN_INPUTS) | {shown})]  # the shown test is a hidden one too
    return f"x * {a} {wrong} {b}", f"x * {a} {right} {b}", cases, [shown, value(shown)]


class SWEDomain(Domain):
    name = "swe"

    def sample(self, rng: random.Random) -> Item:
        # Boundary bugs are 96% of the distinct problems; sign bugs add the wrong-operator kind at ~10%.
        family = "sign" if rng.random() < 0.1 else "boundary"
        buggy, fixed, cases, (shown, want) = (sign_bug if family == "sign" else boundary_bug)(rng)
        prompt = f"{_function(buggy)}\nassert f({shown}) == {want}"
        meta = {"family": family, "entry_point": "f", "cases": cases, "buggy": _function(buggy)}
        return Item(self.name, "", prompt, _function(fixed), meta, split_key=_function(buggy))

    def grade(self, item: Item, completion: str) -> float:
        return self.grade_batch([item], [completion])[0]

    def grade_batch(self, items: list[Item], completions: list[str], fast: bool = True) -> list[float]:
        """`fast=False` forces every completion through the sandbox (tests compare the two paths)."""
        jobs = [synthetic_job(extract_code(c), it.meta["entry_point"], it.meta["cases"], fast)
                for it, c in zip(items, completions, strict=True)]
        return run_jobs(jobs)

