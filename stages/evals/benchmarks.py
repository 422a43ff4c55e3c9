"""Real benchmarks: pass@k, and the eval and grade loops over the benchmark registry (stages/domains/benchdata.py).

A benchmark is graded by its domain's own `grade()`, the same function that gives the RL reward, so a benchmark
score and a training reward measure one thing. A sample counts as correct when its grade is 1.0.

- `evaluate_benchmark` generates `samples` completions per item (greedy when samples == 1, else sampled at
  `temperature`) and reports pass@1 and, with samples k > 1, the unbiased pass@k of Chen et al. (2021):
  1 - C(n-c, k) / C(n, k) per item, averaged over items. Domains may add their own metrics through two hooks
  of `Domain` that default to none: `grade_details(item, completion) -> dict | None` (JSON-able, with a "score")
  and `summarize_details(details) -> dict[str, float]` (IFEval's prompt- and instruction-level strict/loose
  accuracy).
  Items whose `meta["groups"]` names axes (MATH's level and subject, MMLU-Pro's category) also get pass@1 per
  group, as `pass@1/<axis>=<value>`.
- `grade_rows` scores completions made elsewhere: each row is a benchmark item plus a `completion`. A bad row
  gets an error with its row number and the rest are still graded. A `BenchmarkError` raised while parsing or
  grading a row (an instruction id the checkers do not know) is about the whole file, and stops the grade.

Item files: each benchmark's loader reads its file under the data root (benchdata.DEFAULT_DATA_ROOT,
`<repo>/../shared/data`, unless given); benchmarks without a shipped file read only the user's `--data`. A user's
file is a local path or an fsspec URL (`s3://...`, `https://...`, `hf://datasets/<org>/<name>/<file>`, which
fsspec resolves through huggingface_hub), in JSON lines (optionally .gz), a JSON array (.json), CSV (.csv) or
Parquet (.parquet), and its rows are in one of two formats: the benchmark's native row format (the loader's
`parse_row`), or the domain-neutral item format `{"prompt": str, "meta": {...}, "reference": str, "id": str}`
where `meta` holds what the domain's grader reads.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.stages.domains import get_domain
from cascade.stages.domains.base import Domain, Item
from cascade.stages.domains.benchdata import (
    BenchmarkError,
    BenchmarkSpec,
    describe,
    load_items,
    read_rows,
    resolve_benchmarks,
)
from cascade.stages.engines.interface import Progress, RolloutEngine

SAMPLED_TEMPERATURE = 0.8  # Chen et al. sample at T=0.8 for pass@k with k > 1; greedy for a single sample


@dataclass
class BenchmarkResult:
    name: str
    domain: str
    metrics: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)  # grade_rows: {"row": n, "error": reason}
    seconds: float = 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # exact integers: no cancellation for large n


def is_correct(score: float) -> bool:
    return score >= 1.0 - 1e-9


def score_items(
    domain: Domain, items: list[Item], completions: list[list[str]]
) -> tuple[list[list[float]], list[list[dict]]]:
    """Scores and per-sample details (empty dicts when the domain keeps none: its `grade_details` is None)."""
    details = [[domain.grade_details(item, c) for c in group] for item, group in zip(items, completions, strict=True)]
    if all(d is None for group in details for d in group):  # one grade_batch call: a domain may grade in parallel
        flat = domain.grade_batch(
            [it for it, g in zip(items, completions, strict=True) for _ in g], [c for g in completions for c in g]
        )
        scores, start = [], 0
        for group in completions:
            scores.append([float(x) for x in flat[start : start + len(group)]])
            start += len(group)
        return scores, [[{} for _ in group] for group in completions]
    return [[float(d["score"]) for d in group] for group in details], details


def summarize(
    domain: Domain, items: list[Item], scores: list[list[float]], details: list[list[dict]], samples: int
) -> dict[str, float]:
    """pass@1, pass@k (k = samples > 1), mean score, pass@1 per group, and the domain's own metrics."""
    if not scores:
        return {"items": 0, "samples": samples}
    metrics: dict[str, float] = {"items": len(scores), "samples": samples}
    ks = [1] + ([samples] if samples > 1 else [])
    for k in ks:
        per_item = [pass_at_k(len(s), sum(map(is_correct, s)), k) for s in scores]
        metrics[f"pass@{k}"] = sum(per_item) / len(per_item)
    flat = [x for s in scores for x in s]
    metrics["mean_score"] = sum(flat) / len(flat)
    metrics.update(pass_at_1_by_group(items, scores))
    metrics.update(domain.summarize_details([d for group in details for d in group]))
    return metrics


def pass_at_1_by_group(items: list[Item], scores: list[list[float]]) -> dict[str, float]:
    """`pass@1/<axis>=<value>` for every group an item's `meta["groups"]` puts it in, sorted by key."""
    members: dict[str, list[float]] = {}
    for item, s in zip(items, scores, strict=True):
        for axis, value in (item.meta.get("groups") or {}).items():
            members.setdefault(f"pass@1/{axis}={value}", []).append(pass_at_k(len(s), sum(map(is_correct, s)), 1))
    return {key: sum(v) / len(v) for key, v in sorted(members.items())}


def evaluate_benchmark(
    engine: RolloutEngine,
    tokenizer,
    name: str,
    limit: int | None = None,
    samples: int = 1,
    data_root: str | Path | None = None,
    *,
    data_file: str | Path | None = None,
    max_new_tokens: int = 512,
    temperature: float | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> BenchmarkResult:
    """Generate and grade: pass@1 (and pass@k with samples > 1) plus one row per (item, sample)."""
    from cascade.stages.engines.interface import SamplingParams
    from cascade.stages.train.model import prompt_ids

    if samples < 1:
        raise BenchmarkError(f"samples must be >= 1, got {samples}")
    started = time.monotonic()
    spec = resolve_benchmarks([name], data_file)[0]
    domain = get_domain(spec.domain)
    items = load_items(spec, data_root, data_file, limit)
    temp = temperature if temperature is not None else (0.0 if samples == 1 else SAMPLED_TEMPERATURE)
    sampling = SamplingParams(temperature=temp, max_new_tokens=max_new_tokens, seed=seed)
    prompts = [prompt_ids(tokenizer, item.prompt) for item in items]
    # one call: the engine schedules every prompt (a freed row takes a waiting prompt); progress as prompts finish
    groups = engine.generate(prompts, samples, sampling, progress=progress)
    texts = [[c.text for c in g] for g in groups]
    scores, details = score_items(domain, items, texts)
    rows = []
    for item, group, sc, det in zip(items, groups, scores, details):
        for j, (comp, s, d) in enumerate(zip(group, sc, det)):
            rows.append(_row(spec, item, j, comp.text, s, d, finish_reason=comp.finish_reason))
    metrics = summarize(domain, items, scores, details, samples)
    return BenchmarkResult(spec.name, spec.domain, metrics, rows, seconds=time.monotonic() - started)


def _row(spec: BenchmarkSpec, item: Item, sample: int, completion: str, score: float, details: dict, **extra) -> dict:
    row = {
        "benchmark": spec.name,
        "id": item.id,
        "sample": sample,
        "prompt": item.prompt,
        "completion": completion,
        "score": score,
        "verdict": "pass" if is_correct(score) else "fail",
        **extra,
    }
    if details:
        row["details"] = {k: v for k, v in details.items() if k != "score"}
    return row


def grade_rows(name: str, data_file: str | Path, progress: Progress | None = None) -> BenchmarkResult:
    """Score completions made elsewhere: rows of the benchmark's item format plus a `completion` string."""
    started = time.monotonic()
    spec = resolve_benchmarks([name], data_file)[0]
    domain = get_domain(spec.domain)
    lines = read_rows(data_file)
    items, scores, details, rows, errors = [], [], [], [], []
    for done, (number, row) in enumerate(lines, 1):
        try:
            if isinstance(row, Exception):
                raise row
            completion = row.get("completion")
            if not isinstance(completion, str):
                raise ValueError(
                    "missing 'completion' (a string)" if completion is None else "'completion' is not a string"
                )
            item = spec.parse_row(row, number - 1)
            item_scores, item_details = score_items(domain, [item], [[completion]])
            s, d = item_scores[0][0], item_details[0][0]
        except BenchmarkError as e:  # about the file, not this row (e.g. an instruction id no checker knows)
            raise BenchmarkError(f"{data_file}: row {number}: {e}") from e
        except Exception as e:  # noqa: BLE001 - any failure is this row's problem; the others still get graded
            errors.append({"row": number, "error": describe(e)})
        else:
            items.append(item)
            scores.append([s])
            details.append([d])
            rows.append(_row(spec, item, 0, completion, s, d, row=number))
        if progress is not None:
            progress(done, len(lines))
    metrics = summarize(domain, items, scores, details, 1)
    metrics["errors"] = len(errors)
    return BenchmarkResult(spec.name, spec.domain, metrics, rows, errors, time.monotonic() - started)
