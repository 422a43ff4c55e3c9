"""MCQA: multiple-choice questions answered with a letter, "The answer is (B)."; MMLU-STEM, MMLU-Pro, GPQA.

Synthetic items: "Which number is the largest? (A) 3 (B) 7 (C) 5 (D) 1" (or smallest), four distinct digits.
Short and regular, so a ~3M-parameter model can learn the argmax/argmin in minutes; 2 kinds x 10*9*8*7 digit
orders = 10,080 distinct problems, so the hashed 10% held-out split has ~1,000.

Grader (reward and eval, every benchmark below): the extracted letter equals the gold letter. The letter is, in
order: the last "answer is (X)" / "answer: X" phrase or `\\boxed{X}` (also `\\boxed{(X)}`, `\\boxed{\\text{X}}`),
whichever comes last; else a response that *starts* with an option label such as "(B)", "B)", "B." or is a
lone "B"; else a response that *ends* with a bare letter ("... so the answer: **C**", "... Option C."). Anything
else has no answer and scores 0. Letters are upper case only ("the answer is a frameshift mutation" names none).

Real benchmarks, all pass@1 of that grader, prompted as question + "(A) ..." option lines + the answer format:
- mmlu_stem (shipped, 3,018 questions): `question`, `choices` (list), `answer` (gold index), `type` (subject).
- mmlu_pro (the user's file; TIGER-Lab's shape): `question`, `options` (2-10 strings, A-J), `answer` (gold
  letter) and/or `answer_index`, `category`, `question_id`. The options may instead be written inside the
  question after "Options are:", one per line as "(A) ...", "(A): ...", "A. ..." or "A) ...". Adds pass@1 per
  category.
- gpqa (the user's file; the diamond CSV's shape): `Question`, `Correct Answer`, `Incorrect Answer 1`..`3`,
  optional `Record ID`, `High-level domain`. The four answers are shuffled with a seed per item (its Record ID,
  else its row index), so an item's gold letter is the same on every run and spread evenly over A-D across items.
  Adds pass@1 per high-level domain.

Deviations from the public harnesses, and why:
- MMLU numbers are usually 5-shot log-likelihood comparisons of the letters; MMLU-Pro's harness is 5-shot CoT
  generation; GPQA's is zero-shot or CoT generation. We grade one generated zero-shot answer, because the same
  grader must also be the RL reward on sampled completions.
- MMLU-Pro's last-resort extraction takes the last standalone capital A-J *anywhere* in the response, which
  reads the pronoun "I" as option I; we take a bare letter only at the very end of the response.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import JsonlBenchmark

LETTERS = "ABCDEFGHIJ"
OPTIONS_MARKER = "Options are:"
GPQA_ANSWER_FIELDS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
KINDS = {"largest": max, "smallest": min}
ANSWER_FORMAT = 'Answer with the letter of the correct option, in the form "The answer is (X)."'
# The letter is upper case only: "the answer is a frameshift mutation" names no option.
ANSWER_PHRASE = re.compile(r"(?i:answer\s*(?:is|:))\s*:?\s*\(?([A-J])\b")
BOXED_LETTER = re.compile(r"\\boxed\{\s*(?:\\text(?:bf)?\{\s*)?\(?([A-J])\)?\s*\}?\s*\}")
# A bare leading label needs its punctuation (or nothing after it): a leading "A " is usually the article.
LEADING_LABEL = re.compile(r"^\s*\(?([A-J])(?:[).:]|\s*$)")
FINAL_LETTER = re.compile(r"(?:^|[\s(*:])\(?([A-J])\)?[.)*]*\s*$")
OPTION_LINE = re.compile(r"^\s*\(?([A-J])\s*[).:]\s*:?\s*(.*?)\s*$", re.M)


def extract_letter(text: str) -> str | None:
    """The chosen option letter, or None when the response commits to none (see the module docstring)."""
    stated = [(m.end(), m.group(1)) for pattern in (ANSWER_PHRASE, BOXED_LETTER) for m in pattern.finditer(text)]
    if stated:
        return max(stated)[1]
    found = LEADING_LABEL.match(text) or FINAL_LETTER.search(text)
    return found.group(1) if found else None


def format_question(question: str, choices: list[str]) -> str:
    options = "\n".join(f"({LETTERS[i]}) {c}" for i, c in enumerate(choices))
    return f"{question.strip()}\n{options}\n{ANSWER_FORMAT}"


def answer_text(letter: str) -> str:
    return f"The answer is ({letter})."


def mcq_item(
    benchmark: str, key: Any, question: str, choices: list[str], gold: int, groups: dict[str, str] | None = None
) -> Item:
    """One multiple-choice item of any benchmark: options lettered A.., gold given as an index into them."""
    if not 2 <= len(choices) <= len(LETTERS) or not all(isinstance(c, str) for c in choices):
        raise ValueError(f"need 2-{len(LETTERS)} options (strings), got {len(choices)}")
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ValueError(f"the gold answer must index one of the {len(choices)} options, got {gold!r}")
    letter = LETTERS[gold]
    meta = {"answer": letter, "benchmark": benchmark, **({"groups": groups} if groups else {})}
    return Item("mcqa", f"{benchmark}-{key}", format_question(question, choices), answer_text(letter), meta)


def parse_mmlu(row: dict[str, Any], index: int) -> Item:
    """MMLU rows: question, choices (list of strings), answer (gold index), type (subject)."""
    item = mcq_item("mmlu_stem", index, row["question"], list(row["choices"]), row["answer"])
    return replace(item, meta={**item.meta, "subject": row.get("type", "")})


def options_in_question(question: str) -> tuple[str, list[str]]:
    """(question, options) of a question that lists its options after "Options are:", one labelled line each."""
    stem, marker, tail = question.partition(OPTIONS_MARKER)
    if not marker:
        raise ValueError(f"no 'options' list and no {OPTIONS_MARKER!r} in the question")
    found = OPTION_LINE.findall(tail)
    if [label for label, _ in found] != list(LETTERS[: len(found)]):
        raise ValueError(f"the options after {OPTIONS_MARKER!r} are not lines labelled A, B, C, ... in order")
    return stem.strip(), [text for _, text in found]


def parse_mmlu_pro(row: dict[str, Any], index: int) -> Item:
    """MMLU-Pro rows: question, options (or options in the question), answer letter and/or answer_index."""
    if row.get("options"):
        question, options = row["question"], list(row["options"])
    else:
        question, options = options_in_question(row["question"])
    by_letter = LETTERS.find(str(row["answer"]).strip()) if row.get("answer") not in (None, "") else None
    by_index = row.get("answer_index")
    if by_letter is None and by_index is None:
        raise KeyError("answer")
    if by_letter == -1 or (by_letter is not None and by_index is not None and by_letter != by_index):
        raise ValueError(f"'answer' {row['answer']!r} is not a letter A-J matching 'answer_index' {by_index!r}")
    groups = {"category": str(row["category"])} if row.get("category") else None
    return mcq_item(
        "mmlu_pro",
        row.get("question_id", index),
        question,
        options,
        by_letter if by_letter is not None else by_index,
        groups,
    )


def parse_gpqa(row: dict[str, Any], index: int) -> Item:
    """GPQA rows: Question, Correct Answer, Incorrect Answer 1-3; shuffled with a seed per item."""
    key = row.get("Record ID") or index
    answers = [str(row[field]).strip() for field in GPQA_ANSWER_FIELDS]
    order = random.Random(f"gpqa:{key}").sample(range(len(answers)), len(answers))
    groups = {"domain": str(row["High-level domain"])} if row.get("High-level domain") else None
    return mcq_item("gpqa", key, str(row["Question"]), [answers[i] for i in order], order.index(0), groups)


QUESTION_SOURCES = ("digits", "mmlu_stem")  # domains.mcqa.options.questions


class MCQADomain(Domain):
    """questions: "digits" (the synthetic items above) or "mmlu_stem": the shipped MMLU-STEM questions, split into
    train, dev and held-out by the hash of the question text as every domain splits (~80/10/10 of 3,018), so an RL
    stage trains on MMLU-STEM questions and is scored on ones it never saw. data_root: where that file is read
    (None: the default data root)."""

    name = "mcqa"

    def __init__(
        self, num_choices: int = 4, max_value: int = 9, questions: str = "digits", data_root: str | None = None
    ):
        if not 2 <= num_choices <= min(len(LETTERS), max_value + 1):
            raise ValueError(f"num_choices must be in 2..{min(len(LETTERS), max_value + 1)}")
        if questions not in QUESTION_SOURCES:
            raise ValueError(f"unknown mcqa questions {questions!r}; known: {', '.join(QUESTION_SOURCES)}")
        self.num_choices = num_choices
        self.max_value = max_value
        self.source = questions
        self.data_root = data_root
        self._rows: list[Item] | None = None

    def sample(self, rng: random.Random) -> Item:
        kind = rng.choice(sorted(KINDS))
        values = rng.sample(range(self.max_value + 1), self.num_choices)
        letter = LETTERS[values.index(KINDS[kind](values))]
        options = " ".join(f"({LETTERS[i]}) {v}" for i, v in enumerate(values))
        prompt = f"Which number is the {kind}? {options}"
        key = f"{kind}:{','.join(map(str, values))}"
        return Item(self.name, "", prompt, answer_text(letter), {"answer": letter}, split_key=key)

    def questions(self) -> list[Item] | None:
        """The questions file's items (read once; split by the hash of the prompt, question and options), or None
        for the digit items."""
        if self.source == "digits":
            return None
        if self._rows is None:
            from cascade.stages.recipe.config_base import resolve_data_root

            self._rows = self.benchmarks()[self.source](resolve_data_root(self.data_root))
        return self._rows

    def grade(self, item: Item, completion: str) -> float:
        return float(extract_letter(completion) == item.meta["answer"])

    def benchmarks(self) -> dict[str, Callable]:
        return {
            "mmlu_stem": JsonlBenchmark("mmlu_stem", "mcqa/mmlu_stem_test.jsonl", parse_mmlu),
            "mmlu_pro": JsonlBenchmark("mmlu_pro", None, parse_mmlu_pro),
            "gpqa": JsonlBenchmark("gpqa", None, parse_gpqa),
        }
