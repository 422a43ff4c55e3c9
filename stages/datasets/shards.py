"""The SFT dataset on disk: chat-formatted Parquet shards, and the token counts SFT will see.

One row: `id`, `domain`, `source`, `messages` (list of {role, content}: the user prompt and the teacher's answer,
or a whole conversation, stages/datasets/conversations.py) and `num_tokens`, the length of the row exactly as SFT
tokenizes it (`prompt_ids` + `completion_ids` for one turn, `conversation_example` for a conversation).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

DATA_DIR = "data"
SHARD_GLOB = "shard-*.parquet"
READ_BATCH = 4096


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def chat_row(row_id: str, domain: str, source: str, messages: list[dict[str, str]], num_tokens: int) -> dict[str, Any]:
    return {"id": row_id, "domain": domain, "source": source, "messages": messages, "num_tokens": num_tokens}


def write_shard(rows: list[dict[str, Any]], path: Path) -> None:
    # pyarrow is imported on first use here and in iter_conversations: the stage core imports light
    # (tests/stages/test_light_imports.py)
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("domain", pa.string()),
            ("source", pa.string()),
            ("messages", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            ("num_tokens", pa.int32()),
        ]
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd")


def shard_paths(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob(SHARD_GLOB))


def iter_conversations(paths: list[Path]) -> Iterator[list[dict[str, str]]]:
    """The messages of every row, one record batch at a time."""
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH, columns=["messages"]):
            yield from batch.column("messages").to_pylist()


class TokenCounter:
    """len(prompt_ids(p)) + len(completion_ids(r)) per pair, without a chat-template render per row.

    The template is rendered once around a sentinel; a prompt's text is then prefix + prompt + suffix. That holds
    for templates that insert the content verbatim, which is checked on the first prompt of every batch (a
    template that trims or escapes content falls back to rendering each row). Encoding goes to the backend
    tokenizer directly; `completion_ids` adds one end-of-turn token.
    """

    SENTINEL = "\x00cascade-content\x00"

    def __init__(self, tokenizer):
        self.tokenizer, self.backend = tokenizer, tokenizer.backend_tokenizer
        framed = self._render([self.SENTINEL])[0]
        self.frame = tuple(framed.split(self.SENTINEL)) if framed.count(self.SENTINEL) == 1 else None

    def _render(self, prompts: list[str]) -> list[str]:
        return self.tokenizer.apply_chat_template(
            [[{"role": "user", "content": p}] for p in prompts], add_generation_prompt=True, tokenize=False
        )

    def prompt_texts(self, prompts: list[str]) -> list[str]:
        if self.frame is not None and prompts:
            prefix, suffix = self.frame
            if self._render(prompts[:1])[0] == prefix + prompts[0] + suffix:
                return [prefix + p + suffix for p in prompts]
        return self._render(prompts) if prompts else []

    def conversation(self, messages: list[dict[str, str]]) -> int:
        from cascade.stages.train.model import conversation_example

        return len(conversation_example(self.tokenizer, messages).ids)

    def __call__(self, prompts: list[str], responses: list[str]) -> list[int]:
        encode = self.backend.encode
        return [
            len(encode(t, add_special_tokens=False)) + len(encode(r, add_special_tokens=False)) + 1
            for t, r in zip(self.prompt_texts(prompts), responses, strict=True)
        ]
