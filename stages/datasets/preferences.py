"""Preference pairs: what a reward model trains on, from a domain or from a file in the ecosystem's format.

Torch-free and free of the SFT source machinery, so recipe validation can check a local pair file's first row.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the reward_model kind's check reads a file's first row through this module
    from cascade.stages.kinds.reward_model import PreferenceFile


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str  # the preferred answer
    rejected: str


def pair_of(src: PreferenceFile, row: dict[str, Any], index: int) -> PreferencePair:
    """A file row as a pair; a row without a prompt/chosen/rejected string is a ValueError naming the field."""
    fields = [src.prompt_field, src.chosen_field, src.rejected_field]
    missing = [f for f in fields if not isinstance(row.get(f), str)]
    if missing:
        raise ValueError(f"{src.path}: row {index + 1}: no {missing[0]!r} string")
    return PreferencePair(*(row[f] for f in fields))


def check_first_row(src: PreferenceFile, local_path: str) -> None:
    """Read the first row of a local JSONL or Parquet pair file and check its fields (ValueError if bad)."""
    if (src.format or ("parquet" if local_path.endswith(".parquet") else "jsonl")) == "parquet":
        import pyarrow.parquet as pq

        batch = next(pq.ParquetFile(local_path).iter_batches(batch_size=1), None)
        row = batch.to_pylist()[0] if batch is not None and batch.num_rows else None
    else:
        opener = gzip.open if local_path.endswith(".gz") else open
        with opener(local_path, "rt", encoding="utf-8") as f:
            line = next((ln for ln in f if ln.strip()), None)
        try:
            row = json.loads(line) if line is not None else None
        except json.JSONDecodeError as e:
            raise ValueError(f"{src.path}: row 1 is not JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{src.path}: no pair rows")
    pair_of(src, row, 0)
