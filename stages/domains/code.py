"""Code: write a small Python function; graded by running it against hidden tests in the sandbox.

Synthetic items are a chain of one to three integer operations on `x`, said in words, to be written as one
left-nested expression: "Write f(x): x plus 3, times 2." -> `def f(x):\\n    return (x + 3) * 2`. It is a
translation task (words to operators, a fixed nesting pattern) with no arithmetic to do, which is what a ~3M
model can learn in minutes; the 1-3 operations of {plus, minus, times} on constants 0-9 give 27,930 distinct
functions. The split key is the expression, so the prompt template is phrasing.

Grading (the RL reward and the eval metric): the completion's code, then the tests, then a print of a fresh
random nonce. A program passes when it exits 0 AND the nonce is on its stdout, so a completion that exits early
(`os._exit(0)`, `sys.exit()`) before the asserts ran gets 0 (the sandbox judges only the exit status). Known
limit: a program that reads its own source file can find the nonce; the threat we close is early exit and
skipped tests, not a policy that parses its own program. Hidden synthetic tests also check `type(result) is
int`, so an object whose `__eq__` always says True does not pass.

Fast path (synthetic items only): an answer that is exactly `def f(x): return <expr>` with <expr> built from
x, int literals, + - * // % and `a if x <op> c else b` is scored by interpreting <expr> on the host, which
gives the sandbox's verdict without starting a process (a sandbox run costs ~0.1-0.2 s here, and a GRPO step
grades 100+ completions on 2 shared cores). Every other answer, including anything that could run code when
the function is defined, goes to the sandbox. `grade_batch(..., fast=False)` forces the sandbox.

Real benchmarks (eval):
- "humaneval": HumanEval's prompt (signature + docstring) shown in a ```python block. We run
  prompt + completion + test + `check(entry_point)` as the benchmark does, with one deviation: a completion
  that defines the whole function (what chat models answer) is appended after the prompt instead of
  continuing it, so it replaces the stub. A body-only completion continues the prompt as in the original.
- "mbpp": the 500-task test split (task_id 11-510), prompted as in the MBPP paper (task text plus its three
  asserts, which name the function). Program: code + test_setup_code + test_list; challenge tests not run.
Both use sandbox limits of 5 CPU-s / 10 wall-s (HumanEval's harness uses a 3 s timeout; ours is looser
because 2 shared cores run programs in parallel with training).
- "livecodebench": stdin/stdout contest problems from the user's file, graded per test with LiveCodeBench's
  time limits and output comparison; see stages/domains/livecodebench.py.

Completion format: the first ```python (or bare ```) block that defines a function, else the first block,
else the raw text; when raw text does not parse, the part from its first `def`/`import`/`from`/`class` line.
"""

from __future__ import annotations

import ast
import operator
import random
import re
import secrets
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cascade.sandbox import SandboxLimits, run_many
from cascade.stages.domains.base import Domain, Item, Split
from cascade.stages.domains.benchdata import JsonlBenchmark, NativeBenchmark, read_jsonl
from cascade.stages.domains.livecodebench import livecodebench_item, livecodebench_program, livecodebench_wall_seconds

OPS = {"plus": "+", "minus": "-", "times": "*"}
TEMPLATES = ("Write f(x): {words}.", "Write f(x) = {words}.", "Code f(x): {words}.")
TEST_INPUTS = (-7, -2, 0, 1, 3, 6, 11)
SYNTHETIC_LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5.0)  # our programs are a few asserts
BENCHMARK_LIMITS = SandboxLimits(cpu_seconds=5, wall_seconds=10.0)
LIVECODEBENCH_TEST_CPU_S = 6  # RLIMIT_CPU is per process: each test's process gets LiveCodeBench's 6 s
MBPP_TEST_IDS = range(11, 511)  # the MBPP paper's test split
MBPP_VALIDATION_IDS = range(511, 601)  # its validation split

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)
_CODE_START = re.compile(r"^(def |async def |class |import |from )", re.M)


# --------------------------------------------------------------------------- completions -> programs


def extract_code(completion: str) -> str:
    """The code of a completion (see the module docstring). Indentation is kept: a body continuation starts
    indented. Leading blank lines and trailing whitespace are dropped."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(completion)]
    blocks = [b for lang, b in blocks if lang in ("", "python", "py", "python3")]
    if blocks:
        code = next((b for b in blocks if "def " in b), blocks[0])
    else:
        code = completion
        if not _parses(code.strip("\n")):
            start = _CODE_START.search(code)
            code = code[start.start() :] if start else code
    return code.lstrip("\n").rstrip()


def _parses(code: str) -> bool:
    try:
        with warnings.catch_warnings():  # e.g. MBPP's invalid escape sequences: not our concern here
            warnings.simplefilter("ignore")
            compile(code, "<completion>", "exec", dont_inherit=True)  # compiles only: nothing runs here
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False


@dataclass(frozen=True)
class Job:
    """How to judge one completion: a program to run (code + tests; a nonce is printed after it), or a score
    already known without running anything."""

    body: str | None = None
    limits: SandboxLimits = SYNTHETIC_LIMITS
    score: float | None = None  # set: decided on the host (nothing to run, or the fast path)


def run_jobs(jobs: list[Job], max_workers: int | None = None) -> list[float]:
    """1.0 per job whose program exits 0 and prints its nonce after the tests, else 0.0.

    Identical bodies run once: GRPO groups often repeat a completion, and the sandbox is the slow part.
    """
    unique: dict[tuple[str, SandboxLimits], float] = {}
    for job in jobs:
        if job.score is None and job.body is not None and _parses(job.body):
            unique.setdefault((job.body, job.limits), 0.0)
    by_limits: dict[SandboxLimits, list[str]] = {}
    for body, limits in unique:
        by_limits.setdefault(limits, []).append(body)
    for limits, bodies in by_limits.items():
        nonces = [f"CASCADE-DONE-{secrets.token_hex(16)}" for _ in bodies]  # fresh per run, unguessable
        programs = [f"{b}\n\nprint({n!r})\n" for b, n in zip(bodies, nonces)]
        for body, nonce, verdict in zip(bodies, nonces, run_many(programs, limits, max_workers)):
            unique[(body, limits)] = float(verdict.passed and nonce in verdict.stdout.splitlines())
    return [j.score if j.score is not None else unique.get((j.body or "", j.limits), 0.0) for j in jobs]


def int_tests(entry_point: str, cases: list[list[int]]) -> str:
    """Asserts that `entry_point(x)` returns exactly the int `want` for each (x, want)."""
    return (
        f"for _x, _want in {[tuple(c) for c in cases]!r}:\n"
        f"    _got = {entry_point}(_x)\n"
        "    assert type(_got) is int and _got == _want, (_x, _got, _want)\n"
    )


def synthetic_job(code: str, entry_point: str, cases: list[list[int]], fast: bool = True) -> Job:
    """The job for a synthetic item (code and swe): the host fast path when it applies, else the sandbox."""
    if not code.strip():
        return Job(score=0.0)
    if fast:
        score = host_check(code, entry_point, cases)
        if score is not None:
            return Job(score=score)
    return Job(f"{code}\n\n{int_tests(entry_point, cases)}", SYNTHETIC_LIMITS)


# --------------------------------------------------------------------------- the host fast path


class _Unsupported(Exception):
    pass


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS = {
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}


def host_check(code: str, entry_point: str, cases: list[list[int]]) -> float | None:
    """The sandbox's verdict, computed without a process, for the one shape synthetic answers have.

    Applies only when the code is exactly `def <entry_point>(p): return <expr>` (no decorators, annotations,
    defaults or other statements: those could run code at definition time) and <expr> uses only p, int
    literals, + - * // %, unary -/+ and `a if <comparison> else b`. Interpreting that expression gives the
    same ints the program would compute, so the score is identical, at ~1000x less CPU than a sandbox run
    (GRPO grades 100+ completions per step on 2 shared cores). None: any other code; the sandbox decides.
    """
    try:
        tree = ast.parse(code)
        param = _single_return_function(tree, entry_point)
        expr = tree.body[0].body[0].value  # type: ignore[attr-defined]
        for x, want in cases:
            got = _eval_int(expr, param, x)
            if type(got) is not int or got != want:
                return 0.0
        return 1.0
    except _Unsupported:
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # let the sandbox path give its verdict (0 for code that does not compile)
    except ZeroDivisionError:
        return 0.0  # the program would raise too


def _single_return_function(tree: ast.Module, entry_point: str) -> str:
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise _Unsupported
    fn = tree.body[0]
    a = fn.args
    plain = not (a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults or a.kw_defaults)
    if fn.name != entry_point or fn.decorator_list or fn.returns or getattr(fn, "type_params", None):
        raise _Unsupported
    if not plain or len(a.args) != 1 or a.args[0].annotation is not None:
        raise _Unsupported
    if len(fn.body) != 1 or not isinstance(fn.body[0], ast.Return) or fn.body[0].value is None:
        raise _Unsupported
    return a.args[0].arg


def _eval_int(node: ast.AST, param: str, x: int) -> int:
    if isinstance(node, ast.Name) and node.id == param:
        return x
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_int(node.left, param, x), _eval_int(node.right, param, x))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_int(node.operand, param, x)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare):
        test = node.test
        if len(test.ops) != 1 or type(test.ops[0]) not in _CMPOPS:
            raise _Unsupported
        left, right = _eval_int(test.left, param, x), _eval_int(test.comparators[0], param, x)
        return _eval_int(node.body if _CMPOPS[type(test.ops[0])](left, right) else node.orelse, param, x)
    raise _Unsupported


# --------------------------------------------------------------------------- the synthetic generator


def chain_expression(steps: list[tuple[str, int]]) -> str:
    """x then each (op word, constant) applied to the whole so far: [(plus,3),(times,2)] -> (x + 3) * 2."""
    expr = "x"
    for i, (word, c) in enumerate(steps):
        expr = f"{expr} {OPS[word]} {c}" if i == 0 else f"({expr}) {OPS[word]} {c}"
    return expr


def evaluate_chain(steps: list[tuple[str, int]], x: int) -> int:
    value = x
    for word, c in steps:
        value = value + c if word == "plus" else value - c if word == "minus" else value * c
    return value


QUESTION_SOURCES = ("synthetic", "mbpp")  # domains.code.options.questions


def mbpp_split(item: Item) -> Split:
    """MBPP's own splits: task_id 11-510 test (held-out here), 511-600 validation (dev), the rest train."""
    task_id = item.meta["task_id"]
    return "heldout" if task_id in MBPP_TEST_IDS else "dev" if task_id in MBPP_VALIDATION_IDS else "train"


class CodeDomain(Domain):
    """questions: "synthetic" (the items above) or "mbpp": MBPP's 974 problems on its own splits (mbpp_split), so
    an RL stage trains on MBPP's train problems, is tuned on its validation ones and scored on its test split.
    data_root: where the MBPP file is read (None: the default data root)."""

    name = "code"

    def __init__(self, questions: str = "synthetic", data_root: str | None = None):
        if questions not in QUESTION_SOURCES:
            raise ValueError(f"unknown code questions {questions!r}; known: {', '.join(QUESTION_SOURCES)}")
        self.source, self.data_root = questions, data_root
        self._rows: list[Item] | None = None

    def questions(self) -> list[Item] | None:
        """MBPP's problems (read once), or None for the synthetic items."""
        if self.source == "synthetic":
            return None
        if self._rows is None:
            from cascade.stages.recipe.config_base import resolve_data_root

            rows = read_jsonl(resolve_data_root(self.data_root) / "code" / "mbpp.jsonl")
            self._rows = [mbpp_item(row) for row in rows]
        return self._rows

    def question_split(self, item: Item) -> Split:
        return mbpp_split(item)

    def sample(self, rng: random.Random) -> Item:
        n_ops = rng.choices((1, 2, 3), weights=(1, 3, 4))[0]
        steps = [(rng.choice(sorted(OPS)), rng.randint(0, 9)) for _ in range(n_ops)]
        expr = chain_expression(steps)
        words = "x " + ", ".join(f"{w} {c}" for w, c in steps)
        prompt = rng.choice(TEMPLATES).format(words=words)
        reference = f"def f(x):\n    return {expr}"
        cases = [[x, evaluate_chain(steps, x)] for x in TEST_INPUTS]
        meta = {"kind": "synthetic", "entry_point": "f", "cases": cases}
        return Item(self.name, "", prompt, reference, meta, split_key=expr)

    def grade(self, item: Item, completion: str) -> float:
        return self.grade_batch([item], [completion])[0]

    def grade_batch(self, items: list[Item], completions: list[str], fast: bool = True) -> list[float]:
        """`fast=False` forces synthetic items through the sandbox (tests compare the two paths)."""
        return run_jobs([build_job(it, c, fast) for it, c in zip(items, completions, strict=True)])

    def benchmarks(self) -> dict[str, Callable[[Path], list[Item]]]:
        return {
            "humaneval": NativeBenchmark(load_humaneval, humaneval_item),
            "mbpp": NativeBenchmark(load_mbpp, mbpp_item),
            "livecodebench": JsonlBenchmark("livecodebench", None, livecodebench_item),
        }


def build_job(item: Item, completion: str, fast: bool = True) -> Job:
    """How to judge `completion` for `item`, whichever source the item came from."""
    m, code = item.meta, extract_code(completion)
    if m["kind"] == "synthetic":
        return synthetic_job(code, m["entry_point"], m["cases"], fast)
    if not code.strip():
        return Job(score=0.0)
    if m["kind"] == "humaneval":
        return Job(humaneval_program(m, code), BENCHMARK_LIMITS)
    if m["kind"] == "mbpp":
        tests = "\n".join(m["tests"])
        return Job(f"{code}\n\n{m['setup']}\n{tests}\n", BENCHMARK_LIMITS)
    if m["kind"] == "livecodebench":
        limits = SandboxLimits(
            cpu_seconds=LIVECODEBENCH_TEST_CPU_S, wall_seconds=livecodebench_wall_seconds(len(m["tests"]))
        )
        return Job(livecodebench_program(code, m["tests"]), limits)
    raise ValueError(f"unknown code item kind {m['kind']!r}")


# --------------------------------------------------------------------------- real benchmarks


def humaneval_program(meta: dict, code: str) -> str:
    entry = meta["entry_point"]
    defines_entry = re.search(rf"^def {re.escape(entry)}\s*\(", code, re.M) is not None
    # A whole function goes after the prompt (replacing its stub); a body continues the prompt's signature.
    head = meta["prompt"] + ("\n" + code if defines_entry else code)
    return f"{head}\n\n{meta['test']}\n\ncheck({entry})\n"


def humaneval_item(row: dict, index: int = 0) -> Item:
    """One HumanEval row (task_id, prompt, canonical_solution, test, entry_point) as an item."""
    prompt = f"Complete the following Python function.\n\n```python\n{row['prompt']}```"
    meta = {
        "kind": "humaneval",
        "task_id": row["task_id"],
        "prompt": row["prompt"],
        "test": row["test"],
        "entry_point": row["entry_point"],
    }
    reference = row["prompt"] + row.get("canonical_solution", "")
    return Item("code", row["task_id"], prompt, reference, meta, split_key=row["task_id"])


def mbpp_item(row: dict, index: int = 0) -> Item:
    """One MBPP row (task_id, text, code, test_list, test_setup_code) as an item."""
    tests = list(row["test_list"])
    prompt = f"{row['text']}\nYour code should pass these tests:\n" + "\n".join(tests)
    meta = {"kind": "mbpp", "task_id": row["task_id"], "setup": row.get("test_setup_code") or "", "tests": tests}
    reference = row.get("code", "").replace("\r\n", "\n")  # the files carry Windows line ends
    return Item("code", f"mbpp/{row['task_id']}", prompt, reference, meta, split_key=f"mbpp/{row['task_id']}")


def load_humaneval(data_root: Path) -> list[Item]:
    return [humaneval_item(row) for row in read_jsonl(data_root / "code" / "HumanEval.jsonl.gz")]


def load_mbpp(data_root: Path) -> list[Item]:
    rows = read_jsonl(data_root / "code" / "mbpp.jsonl")
    return [mbpp_item(row) for row in rows if row["task_id"] in MBPP_TEST_IDS]
