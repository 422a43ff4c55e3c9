"""MCQA: multiple-choice questions answered with a letter, "The answer is (B)."; MMLU-STEM.

Synthetic items: "Which number is the largest? (A) 3 (B) 7 (C) 5 (D) 1" (or smallest), four distinct digits.
Short and regular, so a ~3M-parameter model can learn the argmax/argmin in minutes; 2 kinds x 10*9*8*7 digit
orders = 10,080 distinct problems, so the hashed 10% held-out split has ~1,000.

Grader (reward and eval): the extracted letter equals the gold letter. The letter is taken from the last
"answer is (X)" / "answer: X" phrase; failing that, from a response that *starts* with an option label such
as "(B)", "B)", "B." or is a lone "B". Anything else has no answer and scores 0.

MMLU-STEM (3,018 questions, 4 choices, `answer` = gold index) uses the same prompt shape and grader. Deviation:
the public MMLU numbers are usually 5-shot log-likelihood comparisons of the four letters; we grade a generated
zero-shot answer, because the same grader must also be the RL reward on sampled completions.
"""

from __future__ import annotations

import random
import re
from typing import Any, Callable

from stages.benchmarks import JsonlBenchmark
from stages.domains.base import Domain, Item

LETTERS = "ABCDEFGHIJ"
KINDS = {"largest": max, "smallest": min}
ANSWER_FORMAT = 'Answer with the letter of the correct option, in the form "The answer is (X)."'
# The letter is upper case only: "the answer is a frameshift mutation" names no option.
ANSWER_PHRASE = re.compile(r"(?i:answer\s*(?:is|:))\s*:?\s*\(?([A-J])\b")
# A bare leading label needs its punctuation (or nothing after it): a leading "A " is usually the article.
LEADING_LABEL = re.compile(r"^\s*\(?([A-J])(?:[).:]|\s*$)")


def extract_letter(text: str) -> str | None:
    """The chosen option letter, or None when the response commits to none."""
    found = ANSWER_PHRASE.findall(text)
    if found:
        return found[-1].upper()
    lead = LEADING_LABEL.match(text)
    return lead.group(1) if lead else None


def format_question(question: str, choices: list[str]) -> str:
    options = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
    return f"{question.strip()}\n{options}\n{ANSWER_FORMAT}"


def answer_text(letter: str) -> str:
    return f"The answer is ({letter})."


def parse_mmlu(row: dict[str, Any], index: int) -> Item:
    """MMLU rows: question, choices (list of strings), answer (gold index), type (subject)."""
    choices, gold = list(row["choices"]), row["answer"]
    if not 2 <= len(choices) <= len(LETTERS) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f"need 2-{len(LETTERS)} choices and an answer index into them")
    letter = LETTERS[gold]
    meta = {"answer": letter, "benchmark": "mmlu_stem", "subject": row.get("type", "")}
    return Item("mcqa", f"mmlu_stem-{index}", format_question(row["question"], choices), answer_text(letter), meta)


class MCQADomain(Domain):
    name = "mcqa"

    def __init__(self, num_choices: int = 4, max_value: int = 9):
        if not 2 <= num_choices <= min(len(LETTERS), max_value + 1):
            raise ValueError(f"num_choices must be in 2..{min(len(LETTERS), max_value + 1)}")
        self.num_choices = num_choices
        self.max_value = max_value

    def sample(self, rng: random.Random) -> Item:
        kind = rng.choice(sorted(KINDS))
        values = rng.sample(range(self.max_value + 1), self.num_choices)
        letter = LETTERS[values.index(KINDS[kind](values))]
        options = " ".join(f"({LETTERS[i]}) {v}" for i, v in enumerate(values))
        prompt = f"Which number is the {kind}? {options}"
        key = f"{kind}:{','.join(map(str, values))}"
        return Item(self.name, "", prompt, answer_text(letter), {"answer": letter}, split_key=key)

    def grade(self, item: Item, completion: str) -> float:
        return float(extract_letter(completion) == item.meta["answer"])

    def benchmarks(self) -> dict[str, Callable]:
        return {"mmlu_stem": JsonlBenchmark("mmlu_stem", "mcqa/mmlu_stem_test.jsonl", parse_mmlu)}
