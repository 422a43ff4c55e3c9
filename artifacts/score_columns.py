"""What one number of an eval is: a score column, typed as (domain, split, metric).

Eval records, report.json, baselines, MLflow and the pages key scores by a column's rendered key: `math` (a
domain's primary metric on the eval's split), `greedy/math` (greedy pass@1 beside a sampled primary metric),
`pass@8/math` (pass@k of the same k sampled answers: an item counts when any of them is fully right), `dev/math`
(the primary metric on the dev split, which selects where the eval's own split is held-out), `bench/gsm8k` (a
benchmark's pass@1) and `bench/ifeval:prompt_loose` (a benchmark's other numbers). `ScoreColumn.key` renders a
key and `ScoreColumn.parse` reads one back; no other code builds or splits these strings, so stored reports,
records and baselines keep their keys while code reads columns by their fields.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Split = Literal["eval", "dev", "bench"]  # the eval's own split (recipe eval.split), the dev split, a benchmark's file
PRIMARY = "primary"  # a domain's mean grade over its sampled answers; a benchmark's pass@1
GREEDY = "greedy"
_PASS_AT = "pass@"
_DEV = "dev/"
_BENCH = "bench/"


@dataclass(frozen=True)
class ScoreColumn:
    """One score of an eval. `domain` is a recipe domain, or for split `bench` the benchmark's name; `metric` is
    PRIMARY, GREEDY, `pass@<k>`, or a benchmark's own metric (`prompt_loose`)."""

    domain: str
    split: Split = "eval"
    metric: str = PRIMARY

    @classmethod
    def pass_at(cls, domain: str, k: int) -> ScoreColumn:
        return cls(domain, "eval", f"{_PASS_AT}{k}")

    @classmethod
    def dev(cls, domain: str) -> ScoreColumn:
        return cls(domain, "dev")

    @classmethod
    def benchmark(cls, name: str, metric: str = PRIMARY) -> ScoreColumn:
        return cls(name, "bench", metric)

    @property
    def key(self) -> str:
        """The column's key where scores are stored and shown."""
        if self.split == "bench":
            return _BENCH + self.domain + ("" if self.metric == PRIMARY else f":{self.metric}")
        if self.split == "dev":
            return _DEV + self.domain
        return self.domain if self.metric == PRIMARY else f"{self.metric}/{self.domain}"

    @classmethod
    def parse(cls, key: str) -> ScoreColumn:
        """The column a stored key names (the inverse of `key`)."""
        if key.startswith(_BENCH):
            name, _, metric = key.removeprefix(_BENCH).partition(":")
            return cls.benchmark(name, metric or PRIMARY)
        if key.startswith(_DEV):
            return cls.dev(key.removeprefix(_DEV))
        head, sep, domain = key.partition("/")
        if sep and (head == GREEDY or head.startswith(_PASS_AT)):
            return cls(domain, "eval", head)
        return cls(key)

    @property
    def is_side(self) -> bool:
        """Shown beside a domain's primary metric (greedy, pass@k, dev) or a benchmark's (its other numbers), never
        a bar the gate or a baseline holds a checkpoint to."""
        return self.metric != PRIMARY or self.split == "dev"

    @property
    def is_pass_at(self) -> bool:
        return self.metric.startswith(_PASS_AT)

    def order(self) -> tuple[str, int]:
        """A domain's greedy column sorts right after its primary one, then its pass@k, then its dev score; a
        benchmark's columns by their keys."""
        if self.split == "bench":
            return self.key, 0
        side = 3 if self.split == "dev" else 1 if self.metric == GREEDY else 2 if self.is_pass_at else 0
        return self.domain, side

    def selection(self, keys: Iterable[str]) -> ScoreColumn:
        """The column that selects for this one (the gate, teachers, baselines): for a domain's primary metric its
        dev score where `keys` hold one, else this column."""
        dev = ScoreColumn.dev(self.domain)
        return dev if self.split == "eval" and self.metric == PRIMARY and dev.key in keys else self


def column_order(key: str) -> tuple[str, int]:
    """Sort key of a stored column key (`ScoreColumn.order`)."""
    return ScoreColumn.parse(key).order()
