"""LiveCodeBench code generation: a contest problem, solved by a program that reads stdin and writes stdout.

File shape (the user's file; livecodebench/code_generation_lite's rows): `question_title`, `question_content`
(the statement), `question_id`, `platform`, `difficulty`, `starter_code`, `public_test_cases` and
`private_test_cases`. Each test list is a JSON string (or a list) of `{"input", "output", "testtype": "stdin"}`;
the lite release stores the private list compressed (base64 of zlib of a pickled JSON string), which we decode
with an unpickler that admits nothing but plain strings, so a file cannot run code on the grader.

Grading (code domain, the RL reward and the eval metric): the completion's code (see `code.extract_code`) runs
in the sandbox once per test, public and private, as LiveCodeBench's runner does: the test's input on stdin, a
6-second limit per test (lcb_runner's default timeout), and the output compared as lcb_runner compares it: both
stripped and split into lines, the same number of lines, each line equal after stripping or, failing that, equal
as a list of decimal numbers. All tests pass: 1, else 0. Metric: pass@1 (pass@k with --samples), plus pass@1
per difficulty.

Deviations from lcb_runner, and why:
- Functional (LeetCode-style, `"testtype": "functional"`) tests are not supported: a row with one is an error
  naming the test type, not a silent fail. Their harness calls a method of a `Solution` class with parsed
  arguments; the stdin problems (AtCoder, Codeforces) are graded exactly.
- The per-test programs run as subprocesses of one sandboxed harness program (the sandbox takes no stdin), so a
  problem's tests share one sandbox: the whole run gets (6 + 1) s per test + 5 s of wall clock, as lcb_runner's
  global timeout does, and each test process its own 6 s of CPU. The tests are written into the harness, so a
  problem's tests must fit the sandbox's program size (16 MB).
- lcb_runner runs solutions with `exec` in its own process; we run `python -I -c <code>`, so a solution that
  calls `exit()` or `sys.exit()` after printing its answer passes here too (its exit status is 0).
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zlib
from typing import Any

from cascade.stages.domains.base import Item

TEST_TIMEOUT_S = 6  # lcb_runner's per-test timeout
SUPPORTED_TEST_TYPE = "stdin"

# Runs in the sandbox (standard library only); run_jobs prints its nonce after it, so reaching the end = pass.
HARNESS = """\
import subprocess, sys
from decimal import Decimal, InvalidOperation

SOLUTION = {code!r}
TESTS = {tests!r}


def lines_of(text):
    return [line.strip() for line in text.strip().split("\\n")]


def as_decimals(line):
    try:
        return [Decimal(word) for word in line.split()]
    except InvalidOperation:
        return None


def same_output(got, want):
    got_lines, want_lines = lines_of(got), lines_of(want)
    if len(got_lines) != len(want_lines):
        return False
    for got_line, want_line in zip(got_lines, want_lines):
        if got_line != want_line and (as_decimals(got_line) is None or as_decimals(got_line) != as_decimals(want_line)):
            return False
    return True


for number, (stdin, want) in enumerate(TESTS, 1):
    try:
        run = subprocess.run([sys.executable, "-I", "-c", SOLUTION], input=stdin, capture_output=True, text=True,
                             timeout={timeout})
    except subprocess.TimeoutExpired:
        sys.exit(f"test {{number}}: time limit exceeded")
    if run.returncode != 0:
        sys.exit(f"test {{number}}: runtime error")
    if not same_output(run.stdout, want):
        sys.exit(f"test {{number}}: wrong answer")
"""


class _StringsOnly(pickle.Unpickler):
    """Unpickles plain data only: any class or function reference (the way a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise ValueError(f"compressed test cases may hold only strings, not {module}.{name}")


def decode_tests(field: Any) -> list[dict[str, Any]]:
    """A test-case field as a list of {"input", "output", "testtype"}: a list, a JSON string, or the lite
    release's base64(zlib(pickle(JSON string)))."""
    if isinstance(field, list):
        return field
    if not isinstance(field, str):
        raise ValueError("test cases must be a list or a string")
    text = field.strip()
    if not text.startswith("["):
        try:
            text = _StringsOnly(io.BytesIO(zlib.decompress(base64.b64decode(text)))).load()
        except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as e:
            raise ValueError(f"test cases are neither JSON nor LiveCodeBench's compressed form ({e})") from None
    tests = json.loads(text)
    if not isinstance(tests, list):
        raise ValueError("test cases must decode to a list")
    return tests


def stdin_tests(tests: list[dict[str, Any]]) -> list[list[str]]:
    """[input, expected output] pairs; a test of another type (LeetCode's functional tests) is an error."""
    pairs = []
    for test in tests:
        kind = test.get("testtype", SUPPORTED_TEST_TYPE)
        if kind != SUPPORTED_TEST_TYPE:
            raise ValueError(f"test type {kind!r} is not supported (only {SUPPORTED_TEST_TYPE!r} tests are)")
        pairs.append([str(test["input"]), str(test["output"])])
    return pairs


def livecodebench_item(row: dict[str, Any], index: int = 0) -> Item:
    """One LiveCodeBench row as a code item whose meta carries every test as [stdin, stdout]."""
    tests = stdin_tests(decode_tests(row["public_test_cases"]) + decode_tests(row.get("private_test_cases") or []))
    if not tests:
        raise ValueError("no test cases")
    key = row.get("question_id", index)
    prompt = (
        f"{row['question_content'].strip()}\n\nWrite a Python program that reads the input from standard "
        "input and writes the answer to standard output. Put the program in one ```python block."
    )
    groups = {"difficulty": str(row["difficulty"])} if row.get("difficulty") else None
    meta = {"kind": "livecodebench", "tests": tests, **({"groups": groups} if groups else {})}
    return Item("code", f"livecodebench-{key}", prompt, "", meta, split_key=f"livecodebench-{key}")


def livecodebench_program(code: str, tests: list[list[str]]) -> str:
    """The sandboxed harness that runs `code` on every test and exits non-zero at the first failure."""
    return HARNESS.format(code=code, tests=[tuple(t) for t in tests], timeout=TEST_TIMEOUT_S)


def livecodebench_wall_seconds(test_count: int) -> float:
    """lcb_runner's global timeout for a problem: (timeout + 1) per test, plus 5 s."""
    return (TEST_TIMEOUT_S + 1) * test_count + 5.0
