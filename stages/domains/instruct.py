"""Instruct: IFEval-style verifiable constraints (case, exact word counts, list lines, required words).

Constraint kinds follow MEASURED.md's learnable set. Every check is a pure function of the response, so the
grader is exact; word counting splits on whitespace, as IFEval's own `count_words` approximately does.
"""

from __future__ import annotations

import random
import re

from stages.domains.base import Domain, Item

TOPICS = {
    "cats": "cat fur paws purr nap milk soft tail whiskers play",
    "rain": "rain cloud drop wet grey storm puddle cold wind sky",
    "trees": "tree leaf root bark green branch shade wood tall seed",
    "the sea": "sea wave salt blue tide shore fish boat sand deep",
    "music": "song beat drum note sing tune loud band dance voice",
    "food": "bread soup rice hot sweet salt meal bowl taste eat",
    "winter": "snow ice cold white frost coat fire long dark quiet",
    "books": "book page word story read ink shelf tale paper line",
    "dogs": "dog bark run ball bone walk loyal wag fetch friend",
    "the sun": "sun light warm bright day gold shine morning heat sky",
    "cities": "city street car light crowd tower noise bus road shop",
    "gardens": "garden flower soil seed water grow bloom rose bee path",
    "the moon": "moon night silver glow dark star quiet round tide dream",
    "trains": "train track fast station ride steam whistle car long trip",
    "birds": "bird wing fly nest song feather egg sky tree beak",
    "mountains": "peak snow rock high climb cold trail stone view air",
    "coffee": "coffee cup hot bean dark brew morning bitter mug steam",
    "school": "school class book teacher desk learn pen bell lesson friend",
    "rivers": "river flow water bank stone fish bridge cold boat current",
    "summer": "summer sun hot beach swim long day light ice play",
}
TOPIC_WORDS = {t: w.split() for t, w in TOPICS.items()}
COUNTS = range(2, 9)


def words_of(text: str) -> list[str]:
    return [w.strip(".,!?;:").lower() for w in text.split()]


def check(kind: str, n: int, word: str, text: str) -> bool:
    words = text.split()
    if kind == "lowercase":
        return len(words) == n and text == text.lower() and any(c.isalpha() for c in text)
    if kind == "capitals":
        return len(words) == n and text == text.upper() and any(c.isalpha() for c in text)
    if kind == "end_with":
        return len(words) == n and words_of(text)[-1:] == [word]
    if kind == "start_with":
        return len(words) == n and words_of(text)[:1] == [word]
    if kind == "include":
        return len(words) == n and word in words_of(text)
    if kind == "bullets":
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return len(lines) == n and all(ln.startswith("- ") and len(ln) > 2 for ln in lines)
    raise ValueError(f"unknown constraint kind {kind!r}")


PROMPTS = {
    "lowercase": "Write {n} words about {topic}, all in lowercase.",
    "capitals": "Write {n} words about {topic}, all in capital letters.",
    "end_with": "Write exactly {n} words about {topic}, ending with the word {word}.",
    "include": "Write exactly {n} words about {topic} that include the word {word}.",
    "start_with": "Write exactly {n} words about {topic}, starting with the word {word}.",
    "bullets": "Write a list of {n} items about {topic}, each line starting with '- '.",
}


def oracle_response(kind: str, n: int, topic: str, word: str, rng: random.Random) -> str:
    words = [rng.choice(TOPIC_WORDS[topic]) for _ in range(n)]
    if kind == "end_with":
        words[-1] = word
    elif kind == "start_with":
        words[0] = word
    elif kind == "include":
        words[rng.randrange(n)] = word
    elif kind == "capitals":
        words = [w.upper() for w in words]
    elif kind == "bullets":
        return "\n".join(f"- {w}" for w in words)
    return " ".join(words)


class InstructDomain(Domain):
    name = "instruct"

    def sample(self, rng: random.Random) -> Item:
        kind = rng.choice(sorted(PROMPTS))
        n = rng.choice(COUNTS)
        topic = rng.choice(sorted(TOPICS))
        word = rng.choice(TOPIC_WORDS[topic]) if "{word}" in PROMPTS[kind] else ""
        prompt = PROMPTS[kind].format(n=n, topic=topic, word=word)
        reference = oracle_response(kind, n, topic, word, rng)
        return Item(self.name, "", prompt, reference, {"kind": kind, "n": n, "word": word})

    def grade(self, item: Item, completion: str) -> float:
        m = item.meta
        return float(check(m["kind"], m["n"], m["word"], completion.strip()))
