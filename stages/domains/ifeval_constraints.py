"""Constrained instructions for IF-RL, built the way RLVR-IFEval data is built, in IFEval's own terms.

An item is a base request (from the templates below: a short piece of writing on a subject) followed by one to
three verifiable constraints drawn from IFEval's instruction types, each with random arguments. The item's meta is
IFEval's own (`instruction_id_list`, `kwargs`, `benchmark: ifeval`), so the reward is the grader that scores
IFEval: Google's checkers as `if-verifiable` ships them (stages/domains/instruction_checkers.py), strict prompt-level.

What is chosen, and why:
- Types: the IFEval types whose answers fit a short budget (a few sentences); `language:response_language` is
  left out (a 135M model writes English only), and so is `nth_paragraph_first_word`. Arguments are drawn from
  ranges that fit ~128 new tokens: at most 80 words, 6 sentences, 4 bullets, 3 paragraphs or sections.
- Constraints that cannot hold together (all lowercase and all capitals; JSON and a title outside it; two
  responses and a repeated prompt) never share an item: each type names the families it occupies, and an item
  takes at most one type per family.
- Phrasing: our own words for every constraint, never IFEval's sentences. Every generated prompt is also checked
  against the 541 IFEval prompts: one shared 13-token window (the normalized tokens of stages.datasets.filters)
  and the item is drawn again. Unlike the SFT build's index, windows that several IFEval prompts share are
  compared too: those are exactly IFEval's stock constraint sentences.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cascade.stages.datasets.filters import normalized_tokens

DECONTAMINATION_NGRAM = 13
IFEVAL_FILE = "instruction_following/ifeval_input_data.jsonl"

SUBJECTS = [
    "a rainy afternoon",
    "your favourite season",
    "learning to cook",
    "a trip to the sea",
    "a small garden",
    "the first day at a new job",
    "a city at night",
    "an old bicycle",
    "a walk in the woods",
    "a school library",
    "a lost umbrella",
    "making bread at home",
    "a train journey",
    "a mountain village",
    "the morning commute",
    "a birthday party",
    "a snowy street",
    "a quiet cafe",
    "a visit to a museum",
    "learning to swim",
    "a broken phone",
    "a family dinner",
    "a summer festival",
    "a neighbour's dog",
    "planting a tree",
    "a football match",
    "a power cut",
    "moving to a new flat",
    "a long queue",
    "an early sunrise",
    "a farmers' market",
    "a camping weekend",
    "a science fair",
    "a thunderstorm",
    "a picnic in the park",
    "a bus that is late",
    "the smell of coffee",
    "an old photograph",
    "a kind stranger",
    "a busy kitchen",
    "a children's playground",
    "a lighthouse",
    "a chess game",
    "the last day of school",
    "a street musician",
    "a forgotten key",
    "a hot-air balloon",
    "a recycling day",
    "a night sky full of stars",
    "a rowing boat",
]
REQUESTS = [
    "Write a short story about {s}.",
    "Describe {s} for a friend who has never seen it.",
    "Write a short poem about {s}.",
    "Give some advice to someone dealing with {s}.",
    "Write a note to a neighbour about {s}.",
    "Explain to a child what {s} is like.",
    "Write a diary entry about {s}.",
    "Write a short speech about {s}.",
    "Write a product review inspired by {s}.",
    "Write a text message to your sister about {s}.",
    "List a few things you notice during {s}.",
    "Write a news headline and a short report about {s}.",
    "Write a limerick about {s}.",
    "Write a short blog post about {s}.",
    "Tell a joke about {s}.",
    "Write an invitation to an event about {s}.",
    "Summarize, in plain words, why people enjoy {s}.",
    "Write a short letter of complaint about {s}.",
    "Write a riddle whose answer is {s}.",
    "Write the opening of a mystery novel set during {s}.",
]
KEYWORDS = [
    "window",
    "river",
    "orange",
    "silence",
    "bridge",
    "lantern",
    "paper",
    "garden",
    "music",
    "morning",
    "clock",
    "shadow",
    "pocket",
    "ticket",
    "bottle",
    "journey",
    "yellow",
    "friend",
    "market",
    "storm",
    "letter",
    "candle",
]
END_PHRASES = ["Is there anything else I can help with?", "Any other questions?", "That is all.", "See you soon."]
LETTERS = "aeinorstl"

Draw = tuple[str, dict[str, Any]]  # (our sentence for the constraint, IFEval's kwargs for its checker)


def _no_comma(rng: random.Random, request: str) -> Draw:
    return rng.choice(["Do not use any commas.", "Write without a single comma."]), {}


def _number_words(rng: random.Random, request: str) -> Draw:
    if rng.random() < 0.5:
        n = rng.choice([20, 30, 40, 50, 60, 80])
        return rng.choice([f"Keep it under {n} words.", f"Use fewer than {n} words."]), {
            "num_words": n,
            "relation": "less than",
        }
    n = rng.choice([5, 10, 15, 20, 25])
    return f"Use {n} words or more.", {"num_words": n, "relation": "at least"}


def _number_sentences(rng: random.Random, request: str) -> Draw:
    if rng.random() < 0.5:
        n = rng.randint(2, 6)
        return f"Write fewer than {n} sentences.", {"num_sentences": n, "relation": "less than"}
    n = rng.randint(1, 3)
    return f"Write {n} or more sentences.", {"num_sentences": n, "relation": "at least"}


def _forbidden_words(rng: random.Random, request: str) -> Draw:
    words = sorted(rng.sample(["very", "really", "good", "nice", "the", "and", "thing", "just"], 2))
    return f"Never use the words {words[0]!r} or {words[1]!r}.", {"forbidden_words": words}


def _highlights(rng: random.Random, request: str) -> Draw:
    n = rng.randint(1, 3)
    part = "part" if n == 1 else "parts"
    return f"Mark {n} {part} of your answer with single asterisks, like *this*.", {"num_highlights": n}


def _keyword_frequency(rng: random.Random, request: str) -> Draw:
    word, n = rng.choice(KEYWORDS), rng.randint(1, 3)
    times = "once" if n == 1 else f"{n} times"
    return f"The word {word!r} must appear at least {times}.", {
        "keyword": word,
        "frequency": n,
        "relation": "at least",
    }


def _repeat_prompt(rng: random.Random, request: str) -> Draw:
    return (
        "Start your reply by copying the request before this sentence exactly, then give your answer.",
        {"prompt_to_repeat": request},
    )


def _quotation(rng: random.Random, request: str) -> Draw:
    return rng.choice(["Put your whole reply inside double quotes.", 'Enclose everything you write in "quotes".']), {}


def _lowercase(rng: random.Random, request: str) -> Draw:
    return rng.choice(["Use only lowercase letters.", "Write everything in small letters, no capitals."]), {}


def _capitals(rng: random.Random, request: str) -> Draw:
    return rng.choice(["Use only capital letters.", "WRITE EVERYTHING IN UPPERCASE."]), {}


def _keywords(rng: random.Random, request: str) -> Draw:
    words = sorted(rng.sample(KEYWORDS, rng.randint(1, 2)))
    return f"Mention the word{'s' * (len(words) > 1)} {' and '.join(words)}.", {"keywords": words}


def _title(rng: random.Random, request: str) -> Draw:
    return "Give it a title wrapped in double angle brackets, like <<my title>>.", {}


def _letter_frequency(rng: random.Random, request: str) -> Draw:
    letter = rng.choice(LETTERS)
    if rng.random() < 0.5:
        n = rng.randint(3, 10)
        return f"The letter {letter!r} should appear at least {n} times.", {
            "letter": letter,
            "let_frequency": n,
            "let_relation": "at least",
        }
    n = rng.randint(15, 40)
    return f"Use the letter {letter!r} fewer than {n} times.", {
        "letter": letter,
        "let_frequency": n,
        "let_relation": "less than",
    }


def _bullets(rng: random.Random, request: str) -> Draw:
    n = rng.randint(2, 4)
    return f"Answer as a list of exactly {n} points, each line starting with '* '.", {"num_bullets": n}


def _placeholders(rng: random.Random, request: str) -> Draw:
    n = rng.randint(1, 3)
    return f"Leave {n} blank{'s' * (n > 1)} in square brackets, such as [name], for the reader to fill in.", {
        "num_placeholders": n
    }


def _end_phrase(rng: random.Random, request: str) -> Draw:
    phrase = rng.choice(END_PHRASES)
    return f"Your last words must be: {phrase}", {"end_phrase": phrase}


def _postscript(rng: random.Random, request: str) -> Draw:
    marker = rng.choice(["P.S.", "P.P.S"])
    return f"Add a postscript at the end that begins with {marker}", {"postscript_marker": marker}


def _capital_words(rng: random.Random, request: str) -> Draw:
    n = rng.randint(1, 3)
    return f"Include at least {n} fully capitalized word{'s' * (n > 1)}, like WOW.", {
        "capital_frequency": n,
        "capital_relation": "at least",
    }


def _two_responses(rng: random.Random, request: str) -> Draw:
    return "Write two different answers and put a line of six asterisks (******) between them.", {}


def _json(rng: random.Random, request: str) -> Draw:
    return "Reply with valid JSON only.", {}


def _constrained_response(rng: random.Random, request: str) -> Draw:
    return "Is this a good idea? Reply with one of: My answer is yes., My answer is no., My answer is maybe.", {}


def _paragraphs(rng: random.Random, request: str) -> Draw:
    n = rng.randint(2, 3)
    return f"Write {n} paragraphs and separate them with a line holding only ***.", {"num_paragraphs": n}


def _sections(rng: random.Random, request: str) -> Draw:
    n, word = rng.randint(2, 3), rng.choice(["Section", "SECTION"])
    return f"Split your answer into {n} parts, each starting with '{word} X' where X is its number.", {
        "section_spliter": word,
        "num_sections": n,
    }


# instruction id -> (the families it occupies, its draw); an item holds at most one type of each family
CONSTRAINTS: dict[str, tuple[frozenset[str], Callable[[random.Random, str], Draw]]] = {
    "punctuation:no_comma": (frozenset({"comma"}), _no_comma),
    "length_constraints:number_words": (frozenset({"length"}), _number_words),
    "length_constraints:number_sentences": (frozenset({"length"}), _number_sentences),
    "keywords:forbidden_words": (frozenset({"words"}), _forbidden_words),
    "detectable_format:number_highlighted_sections": (frozenset({"markup"}), _highlights),
    "keywords:frequency": (frozenset({"words"}), _keyword_frequency),
    "combination:repeat_prompt": (frozenset({"start", "shape"}), _repeat_prompt),
    "startend:quotation": (frozenset({"start", "end", "shape"}), _quotation),
    "change_case:english_lowercase": (frozenset({"case"}), _lowercase),
    "change_case:english_capital": (frozenset({"case"}), _capitals),
    "keywords:existence": (frozenset({"words"}), _keywords),
    "detectable_format:title": (frozenset({"start", "markup"}), _title),
    "keywords:letter_frequency": (frozenset({"letters"}), _letter_frequency),
    "detectable_format:number_bullet_lists": (frozenset({"shape", "markup"}), _bullets),
    "detectable_content:number_placeholders": (frozenset({"markup"}), _placeholders),
    "startend:end_checker": (frozenset({"end"}), _end_phrase),
    "detectable_content:postscript": (frozenset({"end"}), _postscript),
    "change_case:capital_word_frequency": (frozenset({"case"}), _capital_words),
    "combination:two_responses": (frozenset({"shape", "end", "start"}), _two_responses),
    "detectable_format:json_format": (frozenset({"shape", "start", "end", "markup", "case", "comma", "length"}), _json),
    "detectable_format:constrained_response": (
        frozenset({"shape", "start", "end", "markup", "case", "comma", "length", "words", "letters"}),
        _constrained_response,
    ),
    "length_constraints:number_paragraphs": (frozenset({"shape"}), _paragraphs),
    "detectable_format:multiple_sections": (frozenset({"shape", "markup"}), _sections),
}
CONSTRAINT_COUNTS = (1, 1, 2, 2, 3)  # constraints per item, drawn uniformly from this tuple


def draw_constraints(rng: random.Random) -> tuple[str, list[str], list[dict[str, Any]]]:
    """(prompt, instruction ids, kwargs): one base request and its compatible constraints."""
    request = rng.choice(REQUESTS).format(s=rng.choice(SUBJECTS))
    wanted = rng.choice(CONSTRAINT_COUNTS)
    taken: set[str] = set()
    ids: list[str] = []
    sentences: list[str] = []
    kwargs: list[dict[str, Any]] = []
    for instruction_id in rng.sample(sorted(CONSTRAINTS), len(CONSTRAINTS)):
        families, draw = CONSTRAINTS[instruction_id]
        if taken & families:
            continue
        sentence, args = draw(rng, request)
        taken |= families
        ids.append(instruction_id)
        sentences.append(sentence)
        kwargs.append(args)
        if len(ids) == wanted:
            break
    return " ".join([request, *sentences]), ids, kwargs


@functools.cache
def ifeval_windows(data_root: Path) -> frozenset[int]:
    """Hashes of every 13-token window of the IFEval prompts (and of each prompt shorter than 13 tokens)."""
    path = data_root / IFEVAL_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the IFEval prompts that generated instructions are decontaminated against")
    windows: set[int] = set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                windows |= token_windows(json.loads(line)["prompt"])
    return frozenset(windows)


def token_windows(text: str, n: int = DECONTAMINATION_NGRAM) -> set[int]:
    tokens = normalized_tokens(text)
    if len(tokens) < n:
        return {hash(tuple(tokens))} if tokens else set()
    return {hash(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)}


def overlaps_ifeval(prompt: str, data_root: Path) -> bool:
    return not token_windows(prompt).isdisjoint(ifeval_windows(data_root))
