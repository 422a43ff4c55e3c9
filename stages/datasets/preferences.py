"""Preference pairs: what a reward model trains on, from a domain or from a file in the ecosystem's format."""

from __future__ import annotations

from dataclasses import dataclass

from stages.config import PreferenceFile
from stages.datasets.sources import _file_records


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str  # the preferred answer
    rejected: str


def read_preference_file(src: PreferenceFile, limit: int | None = None) -> list[PreferencePair]:
    """The file's pairs (the first `limit` rows); a row without a prompt/chosen/rejected string is a ValueError."""
    fields = [src.prompt_field, src.chosen_field, src.rejected_field]
    pairs = []
    for index, row in enumerate(_file_records(src)):
        if limit is not None and index >= limit:
            break
        missing = [f for f in fields if not isinstance(row.get(f), str)]
        if missing:
            raise ValueError(f"{src.path}: row {index + 1}: no {missing[0]!r} string")
        pairs.append(PreferencePair(*(row[f] for f in fields)))
    return pairs
