"""Chat: open-ended requests graded by a hidden rubric; the RLHF stage's domain (Nemotron-Cascade's alignment RL).

A request names an entity, a topic, a tone and a length range ("Tell me about Ada and the sea in a cheerful tone,
in 5 to 8 words."). The rubric (`grade`) has five checks, each worth 1/5:

- on topic: at least two words of the asked topic, and at least half of the other words (not the entity, tone
  words or filler) from it;
- names the entity asked about;
- the requested tone: a word of that tone and none of another tone;
- length within the asked bounds (whitespace words);
- no repetition: no word twice.

The rubric is the domain's grader, so it is the eval score, but the RLHF policy never sees it: its reward comes
from a reward model trained on preference `pairs()`, where the chosen answer is the oracle's and the rejected one
is a realistic near-miss of it (off topic, wrong tone, padded, repetitive, about someone else, cut off before its
tone word, or garbled into non-words: the last two are how an RL policy at T=1 breaks, and without them the
reward model scored garbled and short answers above the oracle's, docs/LOG.md 2026-11-26). Partial credit
makes the score a mean of fifths, so its standard error is the sample std over sqrt(n), not a binomial one.
"""

from __future__ import annotations

import random

from cascade.stages.datasets.preferences import PreferencePair
from cascade.stages.domains.base import Domain, Item, Split
from cascade.stages.domains.instruct import TOPIC_WORDS, words_of

ENTITIES = [
    "Ada",
    "Bruno",
    "Cleo",
    "Dev",
    "Esme",
    "Finn",
    "Gus",
    "Hana",
    "Ivo",
    "Juno",
    "Kai",
    "Lena",
    "Milo",
    "Nora",
    "Otto",
    "Pia",
    "Quin",
    "Rosa",
    "Sami",
    "Tess",
    "Uma",
    "Vic",
    "Wren",
    "Xena",
    "Yuri",
    "Zoe",
    "Abel",
    "Bea",
    "Cruz",
    "Dara",
    "Eli",
    "Faye",
]  # x 30 topics (instruct's) x 3 tones x 5 lengths: 14,400 problems
TONES = {
    "cheerful": ["yay", "fun", "glad"],
    "gloomy": ["alas", "grim", "sadly"],
    "formal": ["indeed", "kindly", "regards"],
}
FILLER = ["really", "very", "truly", "quite", "so", "just", "much"]  # padding: words with no content
SPAN = 3  # a request allows lo..lo+SPAN words
RUBRIC = ("on_topic", "entity", "tone", "length", "no_repetition")
NEAR_MISSES = ("off_topic", "wrong_tone", "padded", "repetitive", "other_entity", "cut_off", "garbled")
JUNK_CHARS = "bcdfghjklmnprstvwxzaeiou" * 2 + "(=$\ufffd"  # a garbled word: mostly letters, as a byte-level model's


def rubric(meta: dict, text: str) -> dict[str, bool]:
    """Each rubric check of one answer. meta: entity, topic, tone, lo, hi."""
    words = words_of(text)
    entity, topic_words = meta["entity"].lower(), set(TOPIC_WORDS[meta["topic"]])
    tone_words = {w for tone in TONES.values() for w in tone}
    content = [w for w in words if w != entity and w not in tone_words and w not in FILLER]  # padding: length's
    on_topic = [w for w in content if w in topic_words]
    other_tones = {w for tone, ws in TONES.items() if tone != meta["tone"] for w in ws}
    return {
        "on_topic": len(set(on_topic)) >= 2 and 2 * len(on_topic) >= len(content),
        "entity": entity in words,
        "tone": any(w in TONES[meta["tone"]] for w in words) and not any(w in other_tones for w in words),
        "length": meta["lo"] <= len(text.split()) <= meta["hi"],
        "no_repetition": len(set(words)) == len(words) > 0,
    }


def near_miss(meta: dict, chosen: str, kind: str, rng: random.Random) -> str:
    """The oracle's answer with one rubric check broken, the way a weak model breaks it."""
    words = chosen.split()  # [entity, topic words..., tone word]
    body = words[1:-1]
    if kind == "off_topic":
        other = rng.choice([t for t in TOPIC_WORDS if not set(TOPIC_WORDS[t]) & set(body)] or list(TOPIC_WORDS))
        return " ".join([words[0], *rng.sample(TOPIC_WORDS[other], len(body)), words[-1]])
    if kind == "wrong_tone":
        tone = rng.choice([t for t in TONES if t != meta["tone"]])
        return " ".join([*words[:-1], rng.choice(TONES[tone])])
    if kind == "padded":
        extra = meta["hi"] - len(words) + 1 + rng.randrange(3)
        return " ".join([*words[:-1], *(FILLER * 2)[:extra], words[-1]])
    if kind == "repetitive":
        return " ".join([words[0], *[body[0]] * len(body), words[-1]])
    if kind == "other_entity":
        return " ".join([rng.choice([e for e in ENTITIES if e != meta["entity"]]), *words[1:]])
    if kind == "cut_off":  # stopped after two topic words: too short, and no tone word
        return " ".join(words[:3])
    if kind == "garbled":
        return " ".join([words[0], *junk_words(len(body), rng), words[-1]])
    raise ValueError(f"unknown near-miss kind {kind!r}")


def junk_words(n: int, rng: random.Random) -> list[str]:
    """n distinct non-words of 3-8 characters."""
    junk: list[str] = []
    while len(junk) < n:
        word = "".join(rng.choice(JUNK_CHARS) for _ in range(rng.randint(3, 8)))
        if word not in junk and not any(word in topic for topic in TOPIC_WORDS.values()):
            junk.append(word)
    return junk


class ChatDomain(Domain):
    name = "chat"
    builds_pairs = True

    def sample(self, rng: random.Random) -> Item:
        entity, topic, tone = rng.choice(ENTITIES), rng.choice(list(TOPIC_WORDS)), rng.choice(list(TONES))
        lo = rng.randint(4, 8)
        n = rng.randint(lo, lo + SPAN)
        answer = " ".join([entity, *rng.sample(TOPIC_WORDS[topic], n - 2), rng.choice(TONES[tone])])
        prompt = f"Tell me about {entity} and {topic} in a {tone} tone, in {lo} to {lo + SPAN} words."
        meta = {"entity": entity, "topic": topic, "tone": tone, "lo": lo, "hi": lo + SPAN}
        return Item(self.name, "", prompt, answer, meta)

    def grade(self, item: Item, completion: str) -> float:
        checks = rubric(item.meta, completion)
        return sum(checks.values()) / len(checks)

    def pairs(self, split: Split, n: int, seed: int) -> list[PreferencePair]:
        """n preference pairs of one split: (oracle answer, a near-miss of it), the near-miss kinds in turn."""
        rng = random.Random(f"chat-pairs:{split}:{seed}")
        return [
            PreferencePair(
                item.prompt,
                item.reference,
                near_miss(item.meta, item.reference, NEAR_MISSES[i % len(NEAR_MISSES)], rng),
            )
            for i, item in enumerate(self.generate(split, n, seed))
        ]
