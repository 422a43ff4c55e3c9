"""The benchmark registry and the readers of benchmark files: which benchmarks exist, and how their rows load.

Every domain declares its benchmarks (`Domain.benchmarks()`: name -> a loader of the domain's item rows);
`benchmark_registry()` gathers them, so a recipe checks benchmark names here without importing the eval harness
(`stages/evals/benchmarks.py`). A benchmark that a pairwise judge scores instead of a domain (ArenaHard) is a
`JudgedBenchmark` of `JUDGED_BENCHMARKS`, which `cascade eval --judge` runs. The shipped files are the copies in
`shared/data/`, which sits beside the project checkout: `<checkout>/../shared/data`. Loaders take the data root as
an argument so a test or a recipe can point at another copy; `DEFAULT_DATA_ROOT` is what callers pass when they
have no reason to differ: `$CASCADE_DATA_ROOT` when set (a machine where the files lie elsewhere, such as a lent
GPU), else that sibling. A user's own file is a local path or an fsspec URL, in JSON lines (optionally .gz), a JSON
array, CSV or Parquet.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade.artifacts.user_files import UnreadableFile, check_user_file, open_user_file
from cascade.stages.domains import DOMAIN_CLASSES, domain_names, get_domain
from cascade.stages.domains.base import Item

# stages/domains/benchdata.py -> parents[2] is the checkout; shared/ is its sibling.
DEFAULT_DATA_ROOT = (
    Path(os.environ["CASCADE_DATA_ROOT"]).resolve()
    if os.environ.get("CASCADE_DATA_ROOT")
    else Path(__file__).resolve().parents[2].parent / "shared" / "data"
)


class BenchmarkError(ValueError):
    """Bad benchmark input (unknown name, unreadable file): a one-line message for the user."""


# What a row parser raises on a bad row: a missing field, a bad value, or a field of another type than its parser
# reads (an int `answer` where GSM8K's solution text goes, a null `question`: AttributeError)
ROW_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


def is_url(location: str | Path) -> bool:
    return "://" in str(location)


def read_jsonl_lines(location: str | Path) -> Iterator[tuple[int, dict[str, Any] | Exception]]:
    """(1-based row number, row or the error that row raised) for each row of a local file or fsspec URL.

    The format follows the name: .parquet, .csv, .json (a JSON array, or JSON lines as the BFCL files are), else
    JSON lines; a .gz (or other compression suffix fsspec knows) is decompressed first.
    """
    name = str(location)
    stem = name[: -len(".gz")] if name.endswith(".gz") else name
    if stem.endswith(".parquet"):
        import pyarrow.parquet as pq

        with open_user_file(name) as f:
            rows = pq.read_table(f).to_pylist()
        yield from enumerate(rows, 1)
        return
    # errors="replace": a bad byte fails its row, not the file
    with open_user_file(name, compression="infer") as raw, io.TextIOWrapper(raw, "utf-8", errors="replace") as f:
        if stem.endswith(".csv"):
            yield from enumerate(csv.DictReader(f), 1)
        elif stem.endswith(".json") and (text := f.read()).lstrip().startswith("["):
            yield from parse_json_array(text)
        else:
            yield from parse_jsonl_lines(text.splitlines() if stem.endswith(".json") else f)


def parse_json_array(text: str) -> Iterator[tuple[int, dict[str, Any] | Exception]]:
    """(1-based position, row or error) for each element of a JSON array of objects."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        yield 1, ValueError(f"not valid JSON ({e.msg} at line {e.lineno})")
        return
    for number, row in enumerate(rows, 1):
        yield number, row if isinstance(row, dict) else ValueError("not a JSON object")


def parse_jsonl_lines(lines: Iterable[str | bytes]) -> Iterator[tuple[int, dict[str, Any] | Exception]]:
    """(line number, row or error) for each non-blank line of any open stream (a local file, an fsspec file). A
    binary stream's lines are decoded one at a time, so a bad byte is its row's error, not the file's."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line.decode("utf-8") if isinstance(line, bytes) else line)
        except json.JSONDecodeError as e:
            yield number, ValueError(f"not valid JSON ({e.msg} at column {e.colno})")
            continue
        except UnicodeDecodeError as e:
            yield number, ValueError(f"not UTF-8 text ({e})")
            continue
        except ValueError as e:  # an integer of more than 4,300 digits, which Python refuses to convert
            yield number, ValueError(f"a number too long to read ({str(e).partition(';')[0]})")
            continue
        except RecursionError:  # one row nested thousands deep: its own error, not the whole file's
            yield number, ValueError("nested too deeply to parse")
            continue
        yield number, row if isinstance(row, dict) else ValueError("not a JSON object")


def read_rows(location: str | Path) -> list[tuple[int, dict[str, Any] | Exception]]:
    """Every (row number, row or error) of a file or URL; one that cannot be read at all is a BenchmarkError."""
    try:
        return list(read_jsonl_lines(location))
    except UnreadableFile as e:  # missing, or a FIFO or device that a read would wait on or never finish
        raise BenchmarkError(str(e)) from None
    except (OSError, ImportError, ValueError) as e:  # unreachable URL, no such remote file, corrupt Parquet
        hint = (
            " (cascade sets HF_HUB_OFFLINE=1 unless you set it: HF_HUB_OFFLINE=0 reads hf:// URLs)"
            if str(location).startswith("hf://")
            else ""
        )
        raise BenchmarkError(f"cannot read {location}: {describe(e)}{hint}") from e


def read_jsonl(location: str | Path) -> list[dict[str, Any]]:
    """Every row of a data file or URL (see read_jsonl_lines); the first bad row is an error naming it."""
    rows = []
    for number, row in read_rows(location):
        if isinstance(row, Exception):
            raise BenchmarkError(f"{location}:{number}: {row}")
        rows.append(row)
    return rows


@dataclass(frozen=True)
class JsonlBenchmark:
    """Loader of one benchmark file: `loader(data_root)` reads `data_root/relpath` and parses every row.

    `parse_row(row, index) -> Item` is exposed so a user's own file in the same format loads the same way.
    `relpath=None`: no file ships with the project (the data's license or size); only `--data` gives items.
    """

    name: str
    relpath: str | None
    parse_row: Callable[[dict[str, Any], int], Item]

    def no_file(self) -> str:
        """What a benchmark whose file does not ship (relpath None) tells the user."""
        return f"{self.name!r} ships no data file: give its rows with --data FILE_OR_URL"

    def __call__(self, data_root: str | Path) -> list[Item]:
        if self.relpath is None:
            raise BenchmarkError(self.no_file())
        path = Path(data_root) / self.relpath
        rows = read_jsonl(path)
        items = []
        for index, row in enumerate(rows):
            try:
                items.append(self.parse_row(row, index))
            except ROW_ERRORS as e:
                raise BenchmarkError(f"{path}: row {index + 1}: {describe(e)}") from e
        return items


@dataclass(frozen=True)
class NativeBenchmark:
    """Loader of a benchmark that is not one file whose every row parses alike (a subset of a file's rows,
    several files): `loader(data_root)` runs its own `load`; `parse_row(row, index) -> Item` parses one row of
    its native format, so a user's own file in that format loads the same way (as a JsonlBenchmark's does)."""

    load: Callable[[Path], list[Item]]
    parse_row: Callable[[dict[str, Any], int], Item]

    def __call__(self, data_root: Path) -> list[Item]:
        return self.load(data_root)


@dataclass(frozen=True)
class BenchmarkSpec:
    name: str
    domain: str
    loader: Callable[[Path], list[Item]] | None  # None: a domain named directly, for the user's own item file

    def parse_row(self, row: dict[str, Any], index: int) -> Item:
        """One row of a user file: the domain-neutral item format, else the benchmark's native format."""
        if "meta" in row and "prompt" in row:
            if not isinstance(row["meta"], dict) or not isinstance(row["prompt"], str):
                raise ValueError("item rows need 'prompt' (a string) and 'meta' (an object)")
            item_id = str(row.get("id", f"{self.name}-{index}"))
            return Item(self.domain, item_id, row["prompt"], str(row.get("reference", "")), row["meta"])
        if not isinstance(self.loader, (JsonlBenchmark, NativeBenchmark)):  # a loader of no native row format
            raise ValueError(f'{self.name!r} reads only item rows: {{"prompt": ..., "meta": {{...}}}}')
        return self.loader.parse_row(row, index)


def describe(error: BaseException) -> str:
    """A one-line reason: a KeyError says which field is missing, an AttributeError that one has the wrong type."""
    if isinstance(error, KeyError):
        return f"missing field {error.args[0]!r}"
    if isinstance(error, AttributeError):  # alone, `'int' object has no attribute 'strip'` speaks of our code
        return f"a field has the wrong type ({error})"
    return str(error) or type(error).__name__


def benchmark_registry() -> dict[str, BenchmarkSpec]:
    """name -> spec for every benchmark of every domain whose module exists."""
    specs: dict[str, BenchmarkSpec] = {}
    for domain_name in domain_names():
        try:
            domain = get_domain(domain_name)
        except ModuleNotFoundError as e:
            module = DOMAIN_CLASSES.get(domain_name, ":").split(":")[0]
            if e.name != module:
                raise
            continue  # a registered domain whose module has not landed yet has no benchmarks to offer
        for name, loader in domain.benchmarks().items():
            if name in specs:
                raise ValueError(f"benchmark {name!r} is declared by both {specs[name].domain!r} and {domain_name!r}")
            specs[name] = BenchmarkSpec(name, domain_name, loader)
    return specs


@dataclass(frozen=True)
class JudgedBenchmark:
    """A benchmark no domain grades: a pairwise judge scores a model's answers to its prompts against a baseline
    model's (`cascade eval --benchmark NAME --judge URL`). Its file, under the data root, holds one request per
    row in the `prompt` field; `title` names it in errors."""

    name: str
    relpath: str
    title: str

    def prompts(self, data_root: Path, limit: int | None = None) -> list[str]:
        """The first `limit` requests of its file (all of them without a limit)."""
        path = data_root / self.relpath
        if not path.is_file():
            raise FileNotFoundError(f"{self.title} questions not found: {path}")
        rows = path.read_text(encoding="utf-8").splitlines()
        prompts = [json.loads(line)["prompt"] for line in rows if line.strip()]
        return prompts[:limit] if limit is not None else prompts


# Benchmarks a judge scores, apart from benchmark_registry()'s, which their domains grade (what a recipe's
# eval.benchmarks, a decontamination and `cascade grade` take). ArenaHard v0.1: 500 questions.
JUDGED_BENCHMARKS = {
    b.name: b for b in [JudgedBenchmark("arena_hard", "chat_prompts/arena_hard_v0.1_questions.jsonl", "ArenaHard")]
}


def missing_data(spec: BenchmarkSpec, data_root: Path) -> str | None:
    """Why `spec` cannot load from data_root, found without reading it: no data file ships with it, or its file
    (a JsonlBenchmark's) or the data root (another loader's) is not there. None: it looks loadable."""
    loader = spec.loader
    if not isinstance(loader, JsonlBenchmark):
        return None if data_root.exists() else f"data root not found: {data_root}"
    if loader.relpath is None:
        return loader.no_file()
    try:
        check_user_file(data_root / loader.relpath)
    except UnreadableFile as e:
        return str(e)
    return None


def resolve_benchmarks(names: list[str], data_file: str | Path | None = None) -> list[BenchmarkSpec]:
    """Specs for the given names, checked before any work. With a user file, a domain name is accepted too."""
    if not names:
        raise BenchmarkError("no benchmark given")
    if data_file is not None and len(names) != 1:
        raise BenchmarkError("--data needs exactly one --benchmark (it says which format and grader the file uses)")
    if data_file is not None:
        try:
            check_user_file(data_file)  # a local path or file:// URL; a FIFO's read would wait forever
        except UnreadableFile as e:
            raise BenchmarkError(str(e)) from None
    registry = benchmark_registry()
    specs = []
    for name in names:
        if name in registry:
            specs.append(registry[name])
        elif data_file is not None and name in domain_names():
            specs.append(BenchmarkSpec(name, name, None))
        else:
            raise BenchmarkError(f"unknown benchmark {name!r}; known: {', '.join(sorted(registry))}")
    return specs


def load_items(
    spec: BenchmarkSpec,
    data_root: str | Path | None = None,
    data_file: str | Path | None = None,
    limit: int | None = None,
) -> list[Item]:
    """The benchmark's items (the first `limit`), from its own file or the user's `data_file`."""
    if data_file is not None:
        items = []
        for index, row in enumerate(read_jsonl(data_file)):
            try:
                items.append(spec.parse_row(row, index))
            except ROW_ERRORS as e:
                raise BenchmarkError(f"{data_file}: row {index + 1}: {describe(e)}") from e
    elif spec.loader is None:
        raise BenchmarkError(f"{spec.name!r} is a domain, not a benchmark: give its items with --data")
    else:
        root = Path(data_root) if data_root is not None else DEFAULT_DATA_ROOT
        try:
            items = spec.loader(root)
        except (OSError, ValueError) as e:  # a missing or corrupt shared file: one line for the user
            raise BenchmarkError(f"benchmark {spec.name!r}: {describe(e)}") from e
    return items[:limit] if limit is not None else items
