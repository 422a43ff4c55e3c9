"""The data card: rows and tokens per domain and per source, and rows dropped per reason.

Per-shard counts (`SourceCounts` per source label) travel in each shard's manifest, so a resumed build adds up
the committed shards' counts without re-reading their rows' history.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

DROP_REASONS = ("contaminated", "teacher_error", "unverified", "too_long", "duplicate", "near_duplicate")


@dataclass
class SourceCounts:
    domain: str
    input: int = 0  # rows drawn from the source
    rows: int = 0  # rows kept
    tokens: int = 0
    dropped: Counter = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "input": self.input,
            "rows": self.rows,
            "tokens": self.tokens,
            "dropped": {r: self.dropped[r] for r in DROP_REASONS},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceCounts:
        return cls(data["domain"], data["input"], data["rows"], data["tokens"], Counter(data["dropped"]))

    def add(self, other: SourceCounts) -> None:
        self.input += other.input
        self.rows += other.rows
        self.tokens += other.tokens
        self.dropped.update(other.dropped)


class DataCard:
    def __init__(self, info: dict[str, Any]):
        self.info = info  # teachers, filters, eval sets: what the counts mean
        self.sources: dict[str, SourceCounts] = {}

    def add(self, shard: dict[str, SourceCounts]) -> None:
        for label, counts in shard.items():
            self.sources.setdefault(label, SourceCounts(counts.domain)).add(counts)

    def by_domain(self) -> dict[str, SourceCounts]:
        out: dict[str, SourceCounts] = {}
        for counts in self.sources.values():
            out.setdefault(counts.domain, SourceCounts(counts.domain)).add(counts)
        return out

    def dropped(self) -> Counter:
        total: Counter = Counter()
        for counts in self.sources.values():
            total.update(counts.dropped)
        return total

    def to_json(self) -> dict[str, Any]:
        dropped = self.dropped()
        return {
            "rows": sum(c.rows for c in self.sources.values()),
            "tokens": sum(c.tokens for c in self.sources.values()),
            "input": sum(c.input for c in self.sources.values()),
            "dropped": {r: dropped[r] for r in DROP_REASONS},
            "domains": {d: c.to_json() for d, c in sorted(self.by_domain().items())},
            "sources": {s: c.to_json() for s, c in self.sources.items()},
            **self.info,
        }

    def metrics(self) -> dict[str, int]:
        """Flat numbers for report.json and MLflow."""
        card = self.to_json()
        out = {"rows": card["rows"], "tokens": card["tokens"], "input_rows": card["input"]}
        out.update({f"dropped/{r}": n for r, n in card["dropped"].items()})
        for domain, c in card["domains"].items():
            out[f"rows/{domain}"], out[f"tokens/{domain}"] = c["rows"], c["tokens"]
        return out

    def to_markdown(self, title: str) -> str:
        card = self.to_json()
        lines = [
            f"# Data card: {title}",
            "",
            f"{card['rows']} rows, {card['tokens']} tokens, from {card['input']} source rows.",
            "",
            "| source | domain | input | rows | tokens | " + " | ".join(DROP_REASONS) + " |",
            "| --- " * (5 + len(DROP_REASONS)) + "|",
        ]
        for label, c in card["sources"].items():
            drops = " | ".join(str(c["dropped"][r]) for r in DROP_REASONS)
            lines.append(f"| {label} | {c['domain']} | {c['input']} | {c['rows']} | {c['tokens']} | {drops} |")
        lines += ["", "| domain | rows | tokens |", "| --- | --- | --- |"]
        lines += [f"| {d} | {c['rows']} | {c['tokens']} |" for d, c in card["domains"].items()]
        lines += ["", "Settings: `" + json.dumps(self.info, sort_keys=True) + "`", ""]
        return "\n".join(lines)
