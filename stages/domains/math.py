"""Math: multi-step integer arithmetic with worked steps and a `\\boxed{}` answer; GSM8K, AIME24/25, AMC23, HMMT, MATH.

Synthetic items: `num_ops` operations of + and - on operands 0..`max_operand`, with worked steps. The default
(two operations, operands 0-12: 8,788 problems, ~880 each for held-out and dev) is what the ~3M tiny model learns
almost fully in 1,200 SFT steps (0.89-0.96 sampled on dev), above the band where GRPO's groups carry signal; a
third operation changes little (0.94). Operands 0-30 (`domains.math.options: {max_operand: 30}`, recipes/tiny.yaml)
land SFT mid-band, where math RL has something to learn: 0.18-0.31 from 3,000 train sums, whose spread comes from
the seed-dependent step at which the model learns two-digit addition, and 0.24-0.30 from 8,000 (docs/LOG.md,
2026-11-26).

Grader (the RL reward and the eval metric, synthetic and real alike): the content of the *last* `\\boxed{...}`
(braces balanced, so `\\boxed{\\frac{1}{2}}` works) is compared with the gold answer by `math-verify`
equivalence (so `\\boxed{18.0}`, `\\boxed{\\$18}` and `\\boxed{025}` match 18 / 25). No box, no credit.
Gold answers are LaTeX, parsed as math-verify parses them (`\\boxed{<gold>}`), so every shape math-verify knows
is graded as it grades it: tuples `\\left( 3, \\frac{\\pi}{2} \\right)`, intervals `(3,4]`, `(-\\infty, 0]`, unions
`(0,9) \\cup (9,36)`, sets `\\{1\\pm\\sqrt{5},-2\\}` and comma lists `1,-2` (in any order: math-verify reads them
as sets), `x \\in [-2,7]`, `\\dfrac`, degrees, `\\text{...}` units and wrappers, percentages. Only GSM8K's gold
numbers drop their thousands commas. A gold answer is parsed once per process (`parsed_gold`, cached), so a
grade parses only the completion.

Real benchmarks (file shapes; all are pass@1 of this grader):
- gsm8k: `question`, `answer` (worked solution ending `#### <number>`); shipped.
- aime24, amc23 (shipped), aime25, hmmt (the user's file): `problem` (or `question`), `answer` (a string or a
  number), optional `solution` and `id`.
- math (MATH / MATH-500 style, the user's file): `problem`, `answer`, optional `solution`, `level`, `subject`
  (or MATH's `type`), `unique_id`; reports pass@1 per level and per subject besides the overall score.

Deviations from the public benchmarks' usual grading, and why:
- GSM8K is usually scored by regex on the last number of free text. We ask for `\\boxed{}` in the prompt
  and grade only the box, as for every math item, so the reward cannot be farmed by ending with many numbers.
- math-verify bounds its parsing time with SIGALRM, which only works in the main thread. Under Prefect or any
  worker thread we call it without timeouts and instead refuse boxed answers longer than `MAX_ANSWER_CHARS`
  (they are compared as plain strings), which keeps pathological inputs from stalling sympy.
- The exact-string fast path skips sympy for the common case (the tiny model's integer answers), so the
  synthetic domain's scores are what they were before math-verify, only faster to compute.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import JsonlBenchmark

TEMPLATES = ("Compute {expr}.", "What is {expr}?", "Evaluate {expr}.")
BOX_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
MAX_ANSWER_CHARS = 200  # longer boxed contents are compared as strings: sympy can hang on them without a timeout
VERIFY_TIMEOUT_S = 5  # math-verify's own default, used only where signals work (the main thread)

# math-verify warns once per process that timeouts are off; in worker threads that is our deliberate choice.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` with balanced braces, or None (also when it never closes)."""
    start = text.rfind("\\boxed{")
    while start != -1:
        depth, i = 1, start + len("\\boxed{")
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{") : i - 1].strip()
        start = text.rfind("\\boxed{", 0, start)  # an unclosed last box: fall back to the one before
    return None


def boxed_answer(text: str) -> str | None:
    """The content of the last \\boxed{...}, or None."""
    return last_boxed(text)


def verify_timeout() -> int | None:
    """math-verify's signal-based timeout in the main thread; none (see MAX_ANSWER_CHARS) in any other."""
    return VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=65536)
def parsed_gold(gold: str) -> tuple:
    """math-verify's parse of a gold answer (LaTeX), once per process: grading then parses only the completion."""
    from math_verify import parse  # imported late: ~0.5 s, and only graders of real answers need it

    return tuple(parse(f"\\boxed{{{gold}}}", parsing_timeout=verify_timeout()))


def math_equal(gold: str, answer: str) -> bool:
    """math-verify equivalence of two answer strings (LaTeX or plain), safe to call from any thread."""
    if answer == gold:
        return True
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    from math_verify import parse, verify

    timeout = verify_timeout()
    gold_parsed = parsed_gold(gold)
    parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not gold_parsed or not parsed:
        return False
    return bool(verify(list(gold_parsed), parsed, timeout_seconds=timeout))


def worked_solution(operands: list[int], ops: list[str]) -> tuple[str, int]:
    lines, value = [], operands[0]
    for op, x in zip(ops, operands[1:]):
        new = value + x if op == "+" else value - x
        lines.append(f"{value}{op}{x}={new}")
        value = new
    return "\n".join(lines) + f"\n\\boxed{{{value}}}", value


def gold_text(value: Any) -> str:
    """A gold answer as LaTeX text: 27.0 -> "27" (AMC stores floats); a string as written, trimmed of `$...$`."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    return text[1:-1].strip() if len(text) > 1 and text[0] == text[-1] == "$" else text


def real_item(
    benchmark: str, key: Any, question: str, gold: str, solution: str = "", groups: dict[str, str] | None = None
) -> Item:
    prompt = f"{question.strip()}\n\n{BOX_INSTRUCTION}"
    reference = f"{solution.strip()}\n\n\\boxed{{{gold}}}" if solution else f"\\boxed{{{gold}}}"
    meta = {"answer": gold, "benchmark": benchmark, **({"groups": groups} if groups else {})}
    return Item("math", f"{benchmark}-{key}", prompt, reference, meta)


def parse_gsm8k(row: dict, index: int) -> Item:
    """GSM8K rows: question, answer = worked solution ending with `#### <number>` (commas are thousands)."""
    solution, sep, final = row["answer"].rpartition("####")
    if not sep:
        raise ValueError("GSM8K answer has no '####' final-answer marker")
    return real_item("gsm8k", index, row["question"], final.replace(",", "").strip(), solution)


def parse_competition(benchmark: str) -> Callable[[dict, int], Item]:
    """Competition and MATH rows: problem (or question), answer (a string or a number), optional solution, id
    (or MATH-500's unique_id), and the groups MATH reports by: level, subject (or MATH's type)."""

    def parse(row: dict, index: int) -> Item:
        question = row.get("problem") or row["question"]
        gold = gold_text(row["answer"])
        if not gold:
            raise ValueError("empty 'answer'")
        groups = {
            axis: str(row[field])
            for axis, field in (("level", "level"), ("subject", "type"), ("subject", "subject"))
            if row.get(field) not in (None, "")
        }
        key = row.get("unique_id", row.get("id", index))
        return real_item(benchmark, key, question, gold, row.get("solution") or "", groups)

    return parse


class MathDomain(Domain):
    name = "math"

    def __init__(self, num_ops: int = 2, max_operand: int = 12):
        self.num_ops = num_ops
        self.max_operand = max_operand

    def sample(self, rng: random.Random) -> Item:
        operands = [rng.randint(0, self.max_operand) for _ in range(self.num_ops + 1)]
        ops = [rng.choice("+-") for _ in range(self.num_ops)]
        expr = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:]))
        reference, value = worked_solution(operands, ops)
        prompt = rng.choice(TEMPLATES).format(expr=expr)
        return Item(self.name, "", prompt, reference, {"answer": str(value)}, split_key=expr)

    def grade(self, item: Item, completion: str) -> float:
        got = last_boxed(completion)
        return float(got is not None and math_equal(item.meta["answer"], got))

    def benchmarks(self) -> dict[str, Callable]:
        return {
            "gsm8k": JsonlBenchmark("gsm8k", "math/gsm8k_test.jsonl", parse_gsm8k),
            "aime24": JsonlBenchmark("aime24", "math/aime24.jsonl", parse_competition("aime24")),
            "amc23": JsonlBenchmark("amc23", "math/amc23.jsonl", parse_competition("amc23")),
            "aime25": JsonlBenchmark("aime25", None, parse_competition("aime25")),
            "hmmt": JsonlBenchmark("hmmt", None, parse_competition("hmmt")),
            "math": JsonlBenchmark("math", None, parse_competition("math")),
        }
