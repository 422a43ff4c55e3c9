"""Long context: retrieve one key from a haystack of filler sentences and distractor keys.

Prompt: a haystack such as "The sky is grey. The key for owl is 4821. A dog ran home. The key for fox is 0375.
..." followed by "What is the key for owl?". Reference: the key alone, "4821".

The haystack's size is set in the constructor: `num_keys` facts (the asked one plus distractors, each for a
different name) among `num_filler` filler sentences, in random order. The defaults keep the whole chat-formatted
prompt under 120 tokens of the tiny tokenizer, which a ~3M model with a 1024-position window handles; raise
them to stretch the context for bigger models (a few hundred sentences is a few thousand tokens).

Grader (reward and eval): exact match of the extracted key. Every digit run in the response is collected; the
score is 1 only if there is exactly one and it is the key, so "4821", "4821." and "The key for owl is 4821."
pass while listing several keys, or a wrong one, fails. There is no public benchmark behind this domain.
"""

from __future__ import annotations

import random
import re

from cascade.stages.domains.base import Domain, Item

NAMES = (
    "owl fox cat dog elk yak bee ant cow pig hen emu bat eel ram jay "
    "wolf bear deer frog lion mole moth seal swan toad crab duck goat hare lark mink"
).split()
FILLER = (
    "The sky is grey.",
    "A dog ran home.",
    "Rain fell all day.",
    "The tea is hot.",
    "Bells rang at noon.",
    "The road was long.",
    "A boat left port.",
    "Snow hid the path.",
    "The lamp was on.",
    "Birds sang early.",
    "The door was shut.",
    "A train went by.",
    "Leaves fell slowly.",
    "The sea was calm.",
    "Wind shook the trees.",
    "The bread was fresh.",
)
DIGITS = re.compile(r"\d+")


def key_of(text: str) -> str | None:
    """The one digit run in a response, or None when there are none or several."""
    runs = DIGITS.findall(text)
    return runs[0] if len(runs) == 1 else None


class LongContextDomain(Domain):
    name = "longctx"

    def __init__(self, num_keys: int = 3, num_filler: int = 3, key_digits: int = 4):
        if not 1 <= num_keys <= len(NAMES):
            raise ValueError(f"num_keys must be in 1..{len(NAMES)}")
        if num_filler < 0 or key_digits < 1:
            raise ValueError("num_filler must be >= 0 and key_digits >= 1")
        self.num_keys = num_keys
        self.num_filler = num_filler
        self.key_digits = key_digits

    def sample(self, rng: random.Random) -> Item:
        names = rng.sample(NAMES, self.num_keys)
        keys = [f"{rng.randrange(10**self.key_digits):0{self.key_digits}d}" for _ in names]
        facts = [f"The key for {n} is {k}." for n, k in zip(names, keys)]
        filler = [rng.choice(FILLER) for _ in range(self.num_filler)]  # repeats are fine: it is noise
        sentences = facts + filler
        rng.shuffle(sentences)
        target = rng.randrange(self.num_keys)
        prompt = " ".join(sentences) + f"\nWhat is the key for {names[target]}?"
        return Item(self.name, "", prompt, keys[target], {"answer": keys[target], "name": names[target]})

    def grade(self, item: Item, completion: str) -> float:
        return float(key_of(completion) == item.meta["answer"])
