"""Where SFT and RL prompts come from: a domain's synthetic generator, a real file in shared/data, or a user's file.

Every source is a lazy stream of `Row`s (nothing is read before it is needed and nothing is held after it is
passed on), so a build over millions of rows holds one shard at a time. The stream order is fixed by the
recipe: domains in stage order, each domain's sources in recipe order, each source in its own order. Shards
are slices of that one stream, which is what makes a rerun skip exactly the shards it already committed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cascade.artifacts.config import StorageConfig
from cascade.artifacts.store import storage_options
from cascade.artifacts.user_files import open_user_file
from cascade.stages.domains.base import Domain, Item
from cascade.stages.recipe.data_sources import FileSource, ReadsDataFiles, SharedSource, SyntheticSource

if TYPE_CHECKING:  # the recipe checks file sources with this module when it validates
    from cascade.stages.recipe.schema import Recipe

PARQUET_BATCH = 1024  # rows per Parquet record batch read from a user file


class SourceError(ValueError):
    """A source row or file that cannot be read: one line naming the file and row."""


@dataclass(frozen=True)
class Row:
    domain: str
    source: str  # "<domain>/<kind>[:<file name>]": the data card's per-source key
    item: Item  # a conversation's: its user turns as the prompt (what decontamination reads)
    messages: list[dict[str, str]] | None = None  # a whole conversation, answered; None: a prompt to answer


def source_label(domain: str, src: Any) -> str:
    if isinstance(src, SyntheticSource):
        return f"{domain}/synthetic"
    name = src.file if isinstance(src, SharedSource) else src.path
    return f"{domain}/{src.kind}:{Path(name).name}"


def draw_count(src: Any, train_size: int) -> int | None:
    """Rows to take from a source; None: all it has. A synthetic source with neither count nor share: train_size."""
    n = src.rows(train_size)
    return train_size if n is None and isinstance(src, SyntheticSource) else n


def iter_rows(cfg: ReadsDataFiles, recipe: Recipe, domains: list[str], oracle_domains: set[str]) -> Iterator[Row]:
    """Every source row of `domains` (an SFT build's or an RL stage's prompt pool), in stream order.
    oracle_domains: their rows must carry a reference."""
    for domain in domains:
        for src in cfg.domain_sources(domain):
            n = draw_count(src, recipe.domains[domain].train_size)
            label = source_label(domain, src)
            if isinstance(src, SyntheticSource):
                rows = _synthetic_rows(recipe.domain(domain), src, label, n, recipe.seed)
            elif isinstance(src, SharedSource):
                rows = (Row(domain, label, item) for item in _shared_items(src, cfg.resolved_data_root()))
            elif src.gives_conversations():
                rows = _file_conversations(src, domain, label)
            else:
                rows = (Row(domain, label, item) for item in _file_items(src, domain, label, domain in oracle_domains))
            yield from itertools.islice(rows, n)


def _synthetic_rows(domain: Domain, src: SyntheticSource, label: str, n: int, seed: int) -> Iterator[Row]:
    for item in domain.iter_items("train", n, seed):
        yield Row(domain.name, label, item, domain.conversation(item) if src.conversations else None)


def _shared_items(src: SharedSource, data_root: Path) -> Iterator[Item]:
    """A shared/data file parsed by its benchmark's own row parser, so the grader finds the meta it expects."""
    from cascade.stages.domains.benchdata import ROW_ERRORS, benchmark_registry, describe, read_jsonl_lines

    spec = benchmark_registry()[src.format]  # the recipe checked the name and its domain
    path = data_root / src.file
    for index, (number, row) in enumerate(read_jsonl_lines(path)):
        try:
            if isinstance(row, Exception):
                raise row
            yield spec.parse_row(row, index)
        except ROW_ERRORS as e:
            raise SourceError(f"{path}:{number}: {describe(e)}") from None


def check_file_source(src: FileSource, domain: str, needs_reference: bool, graded: bool = True) -> None:
    """Every row of a local file must map to an item or a conversation (read as a stream: a large file costs time,
    not memory), and where its rows are graded, the domain's grader must read the first one's meta. Read when the
    recipe is validated, so a file that is not JSONL or Parquet, a binary or empty file, a bad row anywhere, or rows
    without the meta their grader needs are one line before anything of the run is written."""
    label, conversations = source_label(domain, src), src.gives_conversations()
    if conversations:  # answered already: nothing to grade, no reference needed
        rows = _file_conversations(src, domain, label)
    else:
        rows = (Row(domain, label, item) for item in _file_items(src, domain, label, needs_reference))
    first = None
    try:
        for row in rows:  # every row, streamed
            first = first or row.item
    except SourceError:
        raise
    except (OSError, ValueError) as e:  # not gzip, not Parquet
        raise SourceError(f"{src.path}: cannot read it as {_file_format(src)}: {e}") from None
    if first is None:
        raise SourceError(f"{src.path}: holds no rows")
    if graded and not conversations:
        check_meta(first, src.path)


def check_meta(item: Item, where: str) -> None:
    """The domain's grader must read the row's meta: graded once here (a throwaway answer), so a meta it cannot read
    is one line when the recipe validates, not a traceback after every stage before the one that grades it."""
    from cascade.stages.domains import get_domain
    from cascade.stages.domains.benchdata import describe

    try:
        get_domain(item.domain).grade(item, "x")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise SourceError(
            f"{where}: row 1: its meta is not what the {item.domain} grader reads ({describe(e)}); "
            "docs/RECIPES.md ('RL prompts from files') lists each domain's meta"
        ) from None


def _file_items(src: FileSource, domain: str, label: str, needs_reference: bool) -> Iterator[Item]:
    """A user's JSONL or Parquet file, local or remote, read in a stream and mapped to items by field name: the
    prompt, the reference, and as the meta, the meta object's keys and every other column of the row."""
    for index, row in enumerate(_file_records(src)):
        where = f"{src.path}: row {index + 1}"
        prompt, reference = row.get(src.prompt_field), row.get(src.reference_field)
        meta = row.get(src.meta_field) or {}
        if not isinstance(prompt, str) or not prompt.strip():
            raise SourceError(f"{where}: no {src.prompt_field!r} string")
        if needs_reference and not isinstance(reference, str):
            raise SourceError(f"{where}: no {src.reference_field!r} string, which the oracle teacher answers with")
        if not isinstance(meta, dict):
            raise SourceError(f"{where}: {src.meta_field!r} is not an object")
        # TRL's shape: the row's other columns are fields of the item beside its meta's, as a reward function takes them
        named = (src.prompt_field, src.reference_field, src.meta_field)
        columns = {key: value for key, value in row.items() if key not in named}
        yield Item(domain, f"{label}-{index}", prompt, reference if isinstance(reference, str) else "", columns | meta)


def _file_conversations(src: FileSource, domain: str, label: str) -> Iterator[Row]:
    """A user's file of whole conversations: each row's `messages_field`, checked turn by turn."""
    from cascade.stages.datasets.conversations import check_messages, user_text

    for index, row in enumerate(_file_records(src)):
        try:
            messages = check_messages(row.get(src.messages_field))
        except ValueError as e:
            raise SourceError(f"{src.path}: row {index + 1}: {src.messages_field!r}: {e}") from None
        item = Item(domain, f"{label}-{index}", user_text(messages), "", {})
        yield Row(domain, label, item, messages)


def _file_records(src: FileSource) -> Iterator[dict[str, Any]]:
    options = storage_options(StorageConfig(root=src.path)) if src.path.startswith("s3://") else {}
    if _file_format(src) == "parquet":
        import pyarrow.parquet as pq

        with open_user_file(src.path, **options) as f:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH):
                yield from batch.to_pylist()
        return
    from cascade.stages.domains.benchdata import parse_jsonl_lines

    # binary: a text stream decodes ahead in blocks, so its UnicodeDecodeError could not name the row
    with open_user_file(src.path, compression="infer", **options) as f:
        for number, row in parse_jsonl_lines(f):
            if isinstance(row, Exception):
                raise SourceError(f"{src.path}:{number}: {row}")
            yield row


def _file_format(src: FileSource) -> str:
    return src.format or ("parquet" if src.path.endswith(".parquet") else "jsonl")
