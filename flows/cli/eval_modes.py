"""What `cascade eval` does in each of its modes: every recipe domain's eval split (`eval_splits`), real benchmarks
graded by their domains (`eval_benchmarks`), a benchmark a pairwise judge scores against a baseline model
(`eval_judged`); the command (flows/cli/eval_commands.py) parses the options and picks the mode."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cascade.flows.cli.common import CLIError, console

if TYPE_CHECKING:
    from cascade.stages.domains.benchdata import JudgedBenchmark


@dataclass(frozen=True)
class EvalOptions:
    """`cascade eval`'s options, as the command parsed them: each mode reads what applies to it."""

    model: str
    recipe: str
    benchmark: str | None
    limit: int | None
    samples: int
    data: str | None
    out: Path | None
    max_new_tokens: int
    temperature: float | None
    batch_size: int | None
    engine_kind: str | None
    judge: str | None
    judge_model: str
    judge_key_env: str | None
    baseline: str
    as_json: bool


def eval_splits(o: EvalOptions) -> None:
    """Every recipe domain's eval split (the recipe's `eval.split`), scored as a run's evals score it: the primary
    metric per domain and `greedy/<domain>` beside it."""
    if o.limit is not None or o.samples != 1 or o.data is not None or o.out is not None:
        raise CLIError("--limit, --samples, --data and --out apply to --benchmark runs only")
    loaded = _recipe_on(o.recipe, o.model, o.batch_size, o.engine_kind)
    from cascade.stages.evals.evaluate import evaluate_model  # after the checks: it imports torch and transformers

    with progress_bars(o.as_json) as bar_for:  # a column of a real model's split takes minutes: each has its bar
        scores, _ = evaluate_model(loaded, progress=bar_for, announce=None if o.as_json else _announce)
    if o.as_json:
        typer.echo(json.dumps({"model": o.model, "scores": scores}))
        return
    table = Table(
        "domain",
        "score",
        title=f"{loaded.eval.split} split: {o.model}",
        caption="each domain: the mean grade of k answers sampled at its RL temperature; "
        "greedy/<domain>: greedy pass@1",
    )
    for d, s in scores.items():
        table.add_row(d, f"{s:.3f}")
    console.print(table)


def eval_benchmarks(o: EvalOptions) -> None:
    """The --benchmark names, each graded by its domain: scores.json and <benchmark>.jsonl in the output directory."""
    specs = benchmark_specs(o.benchmark, o.data)
    if o.data is not None:
        _check_items_file(specs[0], o.data)  # a bad row is reported before a model loads or a file is written
    for flag, value, low in (
        ("--limit", o.limit, 1),
        ("--samples", o.samples, 1),
        ("--max-new-tokens", o.max_new_tokens, 1),
        ("--batch-size", o.batch_size, 1),
    ):
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    if o.temperature is not None and o.temperature < 0:
        raise CLIError(f"--temperature must be >= 0, got {o.temperature}")
    tokenizer, engine = _load_for_benchmarks(o.model, o.recipe, o.batch_size, o.engine_kind, quiet=o.as_json)
    settings = {
        "limit": o.limit,
        "samples": o.samples,
        "max_new_tokens": o.max_new_tokens,
        "temperature": o.temperature,
        "data": str(o.data) if o.data else None,
    }
    out_dir = o.out or _default_eval_dir()
    try:
        results = _run_benchmarks(
            engine,
            tokenizer,
            specs,
            settings,
            quiet=o.as_json,
            save=lambda done: _write_benchmark_results(out_dir, o.model, settings, done),
        )
    finally:
        engine.close()
    _print_benchmark_scores(o.model, results, out_dir, o.as_json)


def eval_judged(benchmark: JudgedBenchmark, o: EvalOptions) -> None:
    """Win rate of MODEL's greedy answers over BASELINE's on a judged benchmark's prompts (ArenaHard's), each pair
    judged in both orders: scores.json and <benchmark>.jsonl (prompt, both answers, score) in the output directory."""
    from pydantic import ValidationError

    from cascade.stages.datasets.teachers import TeacherError
    from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
    from cascade.stages.scoring.judge import JudgeError, PairwiseJudge, probe, win_rate
    from cascade.stages.scoring.reward_sources import JudgeReward

    try:
        cfg = JudgeReward(url=o.judge, model=o.judge_model, api_key_env=o.judge_key_env)
        probe(cfg.url, cfg.timeout_s)
        judge = PairwiseJudge(cfg)
        prompts = benchmark.prompts(DEFAULT_DATA_ROOT, o.limit)
    except ValidationError as e:
        raise CLIError(f"--judge: {e.errors()[0]['msg']}") from None
    except (JudgeError, TeacherError, FileNotFoundError) as e:
        raise CLIError(str(e)) from None
    answers = [
        _greedy_answers(source, o.recipe, prompts, o.max_new_tokens, o.batch_size) for source in (o.model, o.baseline)
    ]
    try:
        scores = judge.compare(prompts, *answers)
    except JudgeError as e:
        raise CLIError(str(e)) from None
    rate, se = win_rate(scores)
    result = {
        "model": o.model,
        "baseline": o.baseline,
        "judge": o.judge,
        "prompts": len(prompts),
        "win_rate": rate,
        "standard_error": se,
        "malformed_verdicts": judge.malformed,
        "retries": judge.retries,
    }
    out_dir = o.out or _default_eval_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scores.json").write_text(json.dumps(result, indent=2))
    with open(out_dir / f"{benchmark.name}.jsonl", "w") as f:
        for prompt, a, b, score in zip(prompts, *answers, scores):
            f.write(json.dumps({"prompt": prompt, "model": a, "baseline": b, "score": score}) + "\n")
    if o.as_json:
        typer.echo(json.dumps(result))
        return
    console.print(
        f"{benchmark.name}: {o.model} vs {o.baseline}: win rate {rate:.3f} ± {se or 0:.3f} over {len(prompts)} "
        f"prompts (both orders; {judge.malformed} malformed verdicts scored 0, {judge.retries} retries); "
        f"{out_dir}"
    )


def _greedy_answers(
    source: str, recipe: str, prompts: list[str], max_new_tokens: int, batch_size: int | None
) -> list[str]:
    from cascade.stages.engines.interface import SamplingParams
    from cascade.stages.train.model import prompt_ids

    tokenizer, engine = _load_for_benchmarks(source, recipe, batch_size)
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
        return [g[0].text for g in engine.generate([prompt_ids(tokenizer, p) for p in prompts], 1, greedy)]
    finally:
        engine.close()


def _recipe_on(recipe: str, model: str, batch_size: int | None = None, engine_kind: str | None = None):
    """The recipe with its model source replaced by MODEL ("tiny" keeps the recipe's tiny architecture), and the
    command's --batch-size (engine.batch_size) and --engine (eval.engine) over the recipe's."""
    from cascade.flows.recipes import load_recipe
    from cascade.stages.train.model_source import check_model_source

    if engine_kind not in (None, "hf", "vllm"):
        raise CLIError(f"--engine must be hf or vllm, got {engine_kind!r}")
    loaded = load_recipe(recipe)
    check_model_source(model)  # a bad source is one line before any model loads
    update = {"model": loaded.model.model_copy(update={"source": model})}
    if batch_size is not None:
        update["engine"] = loaded.engine.model_copy(update={"batch_size": batch_size})
    if engine_kind is not None:  # the engine the eval generates on (eval.engine)
        update["eval"] = loaded.eval.model_copy(update={"engine": engine_kind})
    return loaded.model_copy(update=update)


def benchmark_specs(benchmark: str, data: str | None):
    """The specs of comma-separated names; unknown names are a CLIError before any work."""
    from cascade.stages.domains.benchdata import BenchmarkError, resolve_benchmarks

    names = [n.strip() for n in benchmark.split(",") if n.strip()]
    try:
        return resolve_benchmarks(names, data)
    except BenchmarkError as e:
        raise CLIError(str(e)) from None


def _check_items_file(spec, data: str) -> None:
    from cascade.stages.domains.benchdata import BenchmarkError, load_items

    try:
        if not load_items(spec, data_file=data):
            raise CLIError(f"{data} holds no items")
    except BenchmarkError as e:
        raise CLIError(str(e)) from None


def _load_for_benchmarks(
    model: str, recipe: str, batch_size: int | None, engine_kind: str | None = None, quiet: bool = True
):
    """(tokenizer, engine) for a model name, HF dir or checkpoint, with the recipe's engine settings and the
    command's batch size and engine kind over them; unless quiet, the engine's memory plan goes to stderr."""
    from cascade.stages.evals.evaluate import open_policy

    return open_policy(_recipe_on(recipe, model, batch_size, engine_kind), announce=None if quiet else _announce)


def _announce(line: str) -> None:
    Console(stderr=True).print(f"engine: {line}", highlight=False)


@contextmanager
def progress_bars(quiet: bool) -> Iterator[Callable[[str], Callable[[int, int], None]]]:
    """A factory of progress bars on stderr (so --json stdout stays clean): name -> its (done, total) callback.
    The display starts with the first bar, so an error before any (a damaged checkpoint) stays one line."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=False,
        disable=quiet,
    )

    def bar_for(name: str) -> Callable[[int, int], None]:
        if not progress.live.is_started:
            progress.start()
        bar = progress.add_task(name, total=None)
        return lambda done, total: progress.update(bar, completed=done, total=total)

    try:
        yield bar_for
    finally:
        if progress.live.is_started:
            progress.stop()


def _run_benchmarks(engine, tokenizer, specs, settings: dict, quiet: bool, save) -> list:
    """Each benchmark in turn, with a progress bar per benchmark (on stderr, so --json stdout stays clean).

    `save(results so far)` runs after each benchmark, so a long multi-benchmark run keeps what it finished."""
    from cascade.stages.domains.benchdata import BenchmarkError
    from cascade.stages.evals.benchmarks import evaluate_benchmark

    results = []
    with progress_bars(quiet) as bar_for:
        for spec in specs:
            update = bar_for(spec.name)
            try:
                results.append(
                    evaluate_benchmark(
                        engine,
                        tokenizer,
                        spec.name,
                        settings["limit"],
                        settings["samples"],
                        data_file=settings["data"],
                        max_new_tokens=settings["max_new_tokens"],
                        temperature=settings["temperature"],
                        progress=update,
                    )
                )
            except BenchmarkError as e:  # e.g. a bad row in --data: found before any generation
                raise CLIError(str(e)) from None
            save(results)
    return results


def _default_eval_dir() -> Path:
    from cascade.artifacts.config import cascade_home

    return cascade_home() / "evals" / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _write_benchmark_results(out_dir: Path, model: str, settings: dict, results: list) -> None:
    """scores.json plus <benchmark>.jsonl (one row per item and sample) in the output directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = {
        "model": model,
        "settings": settings,
        "benchmarks": {r.name: {"domain": r.domain, "seconds": round(r.seconds, 1), **r.metrics} for r in results},
    }
    (out_dir / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")
    for r in results:
        with open(out_dir / f"{r.name}.jsonl", "w", encoding="utf-8") as f:
            for row in r.rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _print_benchmark_scores(model: str, results: list, out_dir: Path, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"model": model, "scores": {r.name: r.metrics for r in results}, "out": str(out_dir)}))
        return
    table = Table("benchmark", "items", "metric", "score", "seconds", title=f"benchmarks: {model}")
    for r in results:
        shown = [k for k in r.metrics if k not in ("items", "samples")]
        for i, key in enumerate(shown):
            table.add_row(
                r.name if i == 0 else "",
                str(r.metrics["items"]) if i == 0 else "",
                key,
                f"{r.metrics[key]:.3f}",
                f"{r.seconds:.0f}" if i == 0 else "",
            )
    console.print(table)
    console.print(f"per-item results: {out_dir}")
