"""What a domain is: a seeded generator, an oracle teacher, and one grader for both reward and eval.

Train, dev and held-out splits are disjoint by construction: an item's split is decided by a hash of its split key
(the problem, not its phrasing), so no seed or size can leak a held-out or dev problem into training. Dev is where
settings are tuned (`eval.split: dev`); held-out is read for the recorded result only.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:  # a domain that builds preference pairs returns them (stages/domains/chat.py)
    from cascade.stages.datasets.preferences import PreferencePair

Split = Literal["train", "dev", "heldout"]
EVAL_SPLITS: tuple[Split, ...] = ("heldout", "dev")  # what a recipe evaluates or tunes on: never trained on
SIZE_KEYS: dict[Split, str] = {"train": "train_size", "dev": "dev_size", "heldout": "heldout_size"}  # a domain's
SPLIT_BUCKETS = 10  # of the split key's hash: bucket 0 is held out, bucket 1 is dev, the other eight train
MAX_MISSES_IN_ROW = 100_000  # draws in a row without a new item of the split: the split has run out


@dataclass(frozen=True)
class Item:
    domain: str
    id: str
    prompt: str  # the user message
    reference: str  # the oracle's answer: the assistant message that SFT trains on
    meta: dict[str, Any] = field(default_factory=dict)  # what the grader needs (answer, constraints, tests)
    split_key: str = ""  # what decides the split; empty: the prompt. Rephrasings of one problem share a key.


def split_of(key: str) -> Split:
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % SPLIT_BUCKETS
    return "heldout" if bucket == 0 else "dev" if bucket == 1 else "train"


class Domain:
    """Subclasses implement `sample` (one random item) and `grade`; the split logic lives here once. A domain that
    can also take a real benchmark's questions as its items returns them from `questions` (and, where the
    benchmark has splits of its own, says each one's in `question_split`). The optional hooks below default to
    "none": no per-sample details for the eval (`grade_details`, `summarize_details`), no preference pairs
    (`builds_pairs`, `pairs`)."""

    name: str = ""
    builds_pairs: ClassVar[bool] = False  # True: `pairs` builds preference pairs, which a reward model trains on

    def sample(self, rng: random.Random) -> Item:
        raise NotImplementedError

    def questions(self) -> list[Item] | None:
        """A file's questions to draw the splits from instead of `sample`; None (the default): generated items."""
        return None

    def question_split(self, item: Item) -> Split:
        """The split of one of `questions()`: by the hash of its split key, as generated items split."""
        return split_of(item.split_key or item.prompt)

    def grade(self, item: Item, completion: str) -> float:
        """Score in [0, 1]. The same function is the RL reward and the eval metric."""
        raise NotImplementedError

    def conversation(self, item: Item) -> list[dict[str, str]] | None:
        """The item as a multi-turn SFT conversation ({role, content} turns ending with an assistant turn) whose
        first assistant turn is the reference; None: the domain has no multi-turn form."""
        return None

    def grade_batch(self, items: list[Item], completions: list[str]) -> list[float]:
        return [self.grade(item, c) for item, c in zip(items, completions, strict=True)]

    def grade_details(self, item: Item, completion: str) -> dict[str, Any] | None:
        """One sample's grade with what the eval reports beside its score: JSON-able, with a "score". None (the
        default): the domain keeps no details, and the eval grades with one `grade_batch` call."""
        return None

    def summarize_details(self, details: list[dict[str, Any]]) -> dict[str, float]:
        """The domain's own eval metrics from every sample's `grade_details`; {} (the default): none."""
        return {}

    def pairs(self, split: Split, n: int, seed: int) -> list[PreferencePair]:
        """n preference pairs (chosen, rejected) of one split; only a domain whose `builds_pairs` is True has them."""
        raise NotImplementedError(f"domain {self.name!r} builds no preference pairs")

    def benchmarks(self) -> dict[str, Callable[[Path], list[Item]]]:
        """Real benchmark loaders this domain grades: name -> loader(data_root) -> items."""
        return {}

    def generate(self, split: Split, n: int, seed: int) -> list[Item]:
        """n distinct items of one split, deterministic in (split, n, seed)."""
        return list(self.iter_items(split, n, seed))

    def iter_items(self, split: Split, n: int, seed: int) -> Iterator[Item]:
        """generate(), one item at a time: the same items in the same order (only the split keys are held)."""
        questions = self.questions()
        if questions is not None:
            yield from self._questions_of_split(questions, split, n, seed)
            return
        rng = random.Random(f"{self.name}:{seed}")
        seen: set[str] = set()
        attempts = misses = 0
        while len(seen) < n:
            attempts += 1
            # the second bound: a split whose items ran out (a train_size beyond what the generator has) fails in
            # a second, where 50 n draws of a size like 1e8 would run for hours
            if attempts > 50 * n + 1000 or misses > MAX_MISSES_IN_ROW:
                raise ValueError(
                    f"domain {self.name!r} cannot produce {n:,} distinct {split} items (found {len(seen):,}): "
                    f"lower domains.{self.name}.{SIZE_KEYS[split]}"
                )
            item = self.sample(rng)
            key = item.split_key or item.prompt
            if key in seen or split_of(key) != split:
                misses += 1
                continue
            misses = 0
            seen.add(key)
            yield replace(item, id=f"{self.name}-{split}-{len(seen) - 1}")

    def _questions_of_split(self, questions: list[Item], split: Split, n: int, seed: int) -> Iterator[Item]:
        """A file's questions of one split, each once, in an order drawn from the seed; fewer than n is a ValueError
        naming the recipe key to lower. (Drawn with replacement, as `sample` draws, a split's last questions would
        take ~n log n draws to find.)"""
        unique = list({it.prompt: it for it in questions}.values())  # a repeated question counts once
        in_split = [it for it in unique if self.question_split(it) == split]
        if len(in_split) < n:
            raise ValueError(
                f"domain {self.name!r} has {len(in_split)} questions in its {split} split, fewer than {n}: "
                f"lower domains.{self.name}.{SIZE_KEYS[split]}"
            )
        random.Random(f"{self.name}:{seed}").shuffle(in_split)
        for i, item in enumerate(in_split[:n]):
            yield replace(item, domain=self.name, id=f"{self.name}-{split}-{i}")
