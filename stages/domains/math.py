"""Math: multi-step integer arithmetic with worked steps and a `\\boxed{}` answer.

Synthetic items are sized by MEASURED.md: two operations of + and - on single-digit operands is what a ~3M
model learns in minutes; `*` or two-digit operands are not. Operands include 0 so the held-out split has ~400
distinct problems.
"""

from __future__ import annotations

import random
import re

from stages.domains.base import Domain, Item

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
TEMPLATES = ("Compute {expr}.", "What is {expr}?", "Evaluate {expr}.")


def boxed_answer(text: str) -> str | None:
    """The content of the last \\boxed{...}, or None."""
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


def worked_solution(operands: list[int], ops: list[str]) -> tuple[str, int]:
    lines, value = [], operands[0]
    for op, x in zip(ops, operands[1:]):
        new = value + x if op == "+" else value - x
        lines.append(f"{value}{op}{x}={new}")
        value = new
    return "\n".join(lines) + f"\n\\boxed{{{value}}}", value


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
        got = boxed_answer(completion)
        return float(got is not None and got == item.meta["answer"])
