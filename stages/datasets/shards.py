"""The SFT dataset on disk: chat-formatted Parquet shards, and the token counts SFT will see.

One row: `id`, `domain`, `source`, `messages` (list of {role, content}: the user prompt, the teacher's answer)
and `num_tokens`, the length of the row exactly as SFT tokenizes it (`prompt_ids` + `completion_ids`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

DATA_DIR = "data"
SHARD_GLOB = "shard-*.parquet"
SCHEMA = pa.schema([
    ("id", pa.string()),
    ("domain", pa.string()),
    ("source", pa.string()),
    ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("num_tokens", pa.int32()),
])
READ_BATCH = 4096


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def chat_row(row_id: str, domain: str, source: str, prompt: str, response: str, num_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return {"id": row_id, "domain": domain, "source": source, "messages": messages, "num_tokens": num_tokens}


def write_shard(rows: list[dict[str, Any]], path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, compression="zstd")


def shard_paths(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob(SHARD_GLOB))


def iter_conversations(paths: list[Path]) -> Iterator[tuple[str, str]]:
    """(prompt, response) of every row, one record batch at a time."""
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH, columns=["messages"]):
            for messages in batch.column("messages").to_pylist():
                yield messages[0]["content"], messages[1]["content"]


def count_tokens(tokenizer, prompts: list[str], responses: list[str]) -> list[int]:
    """len(prompt_ids(p)) + len(completion_ids(r)) per pair, without a chat-template call per row.

    The templates are rendered in one batch call and encoded by the backend tokenizer directly (about twice as
    fast as `prompt_ids` row by row); `completion_ids` adds one end-of-turn token."""
    if not prompts:
        return []
    texts = tokenizer.apply_chat_template([[{"role": "user", "content": p}] for p in prompts],
                                          add_generation_prompt=True, tokenize=False)
    backend = tokenizer.backend_tokenizer
    return [len(backend.encode(t, add_special_tokens=False)) + len(backend.encode(r, add_special_tokens=False)) + 1
            for t, r in zip(texts, responses, strict=True)]
