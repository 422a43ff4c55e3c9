"""Where the real benchmark files live, and one reader for them.

The files are the copies in `shared/data/` (see its README and MANIFEST.tsv), which sits beside the project
checkout: `<checkout>/../shared/data`. Benchmark loaders take the data root as an argument so a test or a
recipe can point at another copy; `DEFAULT_DATA_ROOT` is what callers pass when they have no reason to differ.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterator

# stages/domains/benchdata.py -> parents[2] is the checkout; shared/ is its sibling.
DEFAULT_DATA_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSON-lines file, gzipped or not (by suffix).

    Blank lines are skipped and a missing final newline is fine (mbpp.jsonl has none); the BFCL files are
    JSON lines despite their `.json` suffix, so the suffix says nothing about the format here.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a JSON line: {e}") from None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"benchmark file missing: {path} (expected the shared/data copy; see its README)")
    return list(iter_jsonl(path))
