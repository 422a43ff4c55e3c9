"""Math: multi-step integer arithmetic with worked steps and a `\\boxed{}` answer; GSM8K, AIME24, AMC23.

Synthetic items are sized by MEASURED.md: two operations of + and - on single-digit operands is what a ~3M
model learns in minutes; `*` or two-digit operands are not. Operands include 0 so the held-out split has ~400
distinct problems.

Grader (the RL reward and the eval metric, synthetic and real alike): the content of the *last* `\\boxed{...}`
(braces balanced, so `\\boxed{\\frac{1}{2}}` works) is compared with the gold answer by `math-verify`
equivalence (so `\\boxed{18.0}`, `\\boxed{\\$18}` and `\\boxed{025}` match 18 / 25). No box, no credit.

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

import logging
import random
import threading
from typing import Any, Callable

from stages.benchmarks import JsonlBenchmark
from stages.domains.base import Domain, Item

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


def math_equal(gold: str, answer: str) -> bool:
    """math-verify equivalence of two answer strings (LaTeX or plain), safe to call from any thread."""
    if answer == gold:
        return True
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return False
    from math_verify import parse, verify  # imported late: ~0.5 s, and only graders of real answers need it

    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    parsed_gold = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
    parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if not parsed_gold or not parsed:
        return False
    return bool(verify(parsed_gold, parsed, timeout_seconds=timeout))


def worked_solution(operands: list[int], ops: list[str]) -> tuple[str, int]:
    lines, value = [], operands[0]
    for op, x in zip(ops, operands[1:]):
        new = value + x if op == "+" else value - x
        lines.append(f"{value}{op}{x}={new}")
        value = new
    return "\n".join(lines) + f"\n\\boxed{{{value}}}", value


def number_text(value: Any) -> str:
    """A gold answer as text: 27.0 -> "27" (AMC stores floats), "1,234" -> "1234" (GSM8K writes commas)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).replace(",", "").strip()


def real_item(benchmark: str, key: Any, question: str, answer: Any, solution: str = "") -> Item:
    prompt = f"{question.strip()}\n\n{BOX_INSTRUCTION}"
    gold = number_text(answer)
    reference = f"{solution.strip()}\n\n\\boxed{{{gold}}}" if solution else f"\\boxed{{{gold}}}"
    return Item("math", f"{benchmark}-{key}", prompt, reference, {"answer": gold, "benchmark": benchmark})


def parse_gsm8k(row: dict, index: int) -> Item:
    """GSM8K rows: question, answer = worked solution ending with `#### <number>`."""
    solution, sep, final = row["answer"].rpartition("####")
    if not sep:
        raise ValueError("GSM8K answer has no '####' final-answer marker")
    return real_item("gsm8k", index, row["question"], final, solution)


def parse_competition(benchmark: str) -> Callable[[dict, int], Item]:
    """AIME24 / AMC23 rows: problem (or question), answer (a string or a float), optional solution and id."""

    def parse(row: dict, index: int) -> Item:
        question = row.get("problem") or row["question"]
        return real_item(benchmark, row.get("id", index), question, row["answer"], row.get("solution", ""))

    return parse


class MathDomain(Domain):
    name = "math"

    def __init__(self, num_ops: int = 2, max_operand: int = 9):
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
        }
