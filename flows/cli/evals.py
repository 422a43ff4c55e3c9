"""`cascade eval | grade`: a model on the held-out splits or real benchmarks; completions made elsewhere."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cascade.flows.cli.common import CLIError, app, console, guarded

BENCHMARK_HELP = (
    "Comma-separated real benchmarks, e.g. gsm8k,ifeval,humaneval,mbpp,mmlu_stem,bfcl_simple; math, "
    "aime25, hmmt, mmlu_pro, gpqa, ifbench and livecodebench read --data (see docs/BENCHMARKS.md)."
)
DATA_FORMAT_HELP = (
    "A local file or fsspec URL (hf://datasets/..., s3://...; JSONL, .json, .csv or .parquet), one item per row, "
    "in the benchmark's own format (gsm8k: question + answer ending '#### N'; "
    "aime24/amc23: problem + answer; mmlu_stem: question + choices + answer index; ifeval: prompt + "
    "instruction_id_list + kwargs) or, for any benchmark, in the item format "
    '{"prompt": "...", "meta": {...}, "reference": "...", "id": "..."}, where meta is what the domain\'s grader '
    "reads (math: answer; mcqa: answer letter; longctx: answer; instruct: kind, n, word or IFEval's fields). "
    "With --data, --benchmark may also name a domain (math, mcqa, ...) for item-format rows."
)


@app.command("eval")
@guarded
def eval_cmd(
    model: str = typer.Argument(
        ..., help="A checkpoint URI/dir (with MANIFEST.json), an HF model dir, 'tiny' or 'smollm2-135m'."
    ),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains and held-out sizes to use."),
    benchmark: str | None = typer.Option(
        None, "--benchmark", help=BENCHMARK_HELP + " Without it: every recipe domain's held-out split."
    ),
    limit: int | None = typer.Option(None, "--limit", help="Only the first N items of each benchmark."),
    samples: int = typer.Option(
        1,
        "--samples",
        help="Completions per item: 1 is greedy pass@1; K > 1 samples "
        "(T=0.8 unless --temperature) and adds unbiased pass@K.",
    ),
    data: str | None = typer.Option(
        None, "--data", help="Your own items instead of the benchmark's file: " + DATA_FORMAT_HELP
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Directory for scores.json and <benchmark>.jsonl "
        "(prompt, completion, verdict per item); default $CASCADE_HOME/evals/<time>.",
    ),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", help="Generation budget per completion."),
    temperature: float | None = typer.Option(None, "--temperature", help="Sampling temperature override."),
    batch_size: int | None = typer.Option(
        None, "--batch-size", help="Rows decoded at once (the recipe's engine.batch_size; fewer where memory is short)."
    ),
    engine_kind: str | None = typer.Option(
        None, "--engine", help="hf or vllm (the vLLM venv's server): the engine that generates; default the recipe's."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        help="torch CPU threads; on a busy machine 1 can be many times faster than oversubscribed OpenMP threads.",
    ),
    judge: str | None = typer.Option(
        None, "--judge", help="arena_hard: the judge's OpenAI-compatible API base (http://host:port/v1)."
    ),
    judge_model: str = typer.Option("judge", "--judge-model", help="arena_hard: the model name the judge serves."),
    judge_key_env: str | None = typer.Option(
        None, "--judge-key-env", help="arena_hard: the NAME of the environment variable holding the judge's API key."
    ),
    baseline: str = typer.Option(
        "tiny", "--baseline", help="arena_hard: the model whose answers MODEL plays against (any model source)."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate a model on every domain's held-out split, or on real benchmarks with --benchmark."""
    if threads is not None:
        if threads < 1:
            raise CLIError(f"--threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    if (benchmark == ARENA_HARD) != (judge is not None):
        raise CLIError(f"--benchmark {ARENA_HARD} needs --judge URL, and --judge applies to it only")
    if judge is not None:
        _eval_arena_hard(
            model, recipe, judge, judge_model, judge_key_env, baseline, limit, max_new_tokens, batch_size, out, as_json
        )
        return
    if benchmark is None:
        if limit is not None or samples != 1 or data is not None or out is not None:
            raise CLIError("--limit, --samples, --data and --out apply to --benchmark runs only")
        _eval_split(_recipe_on(recipe, model, batch_size, engine_kind), model, as_json)
        return
    specs = _benchmark_specs(benchmark, data)
    if data is not None:
        _check_items_file(specs[0], data)  # a bad row is reported before a model loads or a file is written
    for flag, value, low in (
        ("--limit", limit, 1),
        ("--samples", samples, 1),
        ("--max-new-tokens", max_new_tokens, 1),
        ("--batch-size", batch_size, 1),
    ):
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    if temperature is not None and temperature < 0:
        raise CLIError(f"--temperature must be >= 0, got {temperature}")
    tokenizer, engine = _load_for_benchmarks(model, recipe, batch_size, engine_kind, quiet=as_json)
    settings = {
        "limit": limit,
        "samples": samples,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "data": str(data) if data else None,
    }
    out_dir = out or _default_eval_dir()
    try:
        results = _run_benchmarks(
            engine,
            tokenizer,
            specs,
            settings,
            quiet=as_json,
            save=lambda done: _write_benchmark_results(out_dir, model, settings, done),
        )
    finally:
        engine.close()
    _print_benchmark_scores(model, results, out_dir, as_json)


ARENA_HARD = "arena_hard"


def _eval_arena_hard(
    model: str,
    recipe: str,
    url: str,
    judge_model: str,
    key_env: str | None,
    baseline: str,
    limit: int | None,
    max_new_tokens: int,
    batch_size: int | None,
    out: Path | None,
    as_json: bool,
) -> None:
    """Win rate of MODEL's greedy answers over BASELINE's on ArenaHard's questions, judged in both orders."""
    from pydantic import ValidationError

    from cascade.stages.datasets.teachers import TeacherError
    from cascade.stages.domains.benchdata import DEFAULT_DATA_ROOT
    from cascade.stages.scoring.judge import JudgeError, PairwiseJudge, arena_hard_prompts, probe, win_rate
    from cascade.stages.scoring.reward_sources import JudgeReward

    try:
        cfg = JudgeReward(url=url, model=judge_model, api_key_env=key_env)
        probe(cfg.url, cfg.timeout_s)
        judge = PairwiseJudge(cfg)
        prompts = arena_hard_prompts(DEFAULT_DATA_ROOT, limit)
    except ValidationError as e:
        raise CLIError(f"--judge: {e.errors()[0]['msg']}") from None
    except (JudgeError, TeacherError, FileNotFoundError) as e:
        raise CLIError(str(e)) from None
    answers = [_greedy_answers(source, recipe, prompts, max_new_tokens, batch_size) for source in (model, baseline)]
    try:
        scores = judge.compare(prompts, *answers)
    except JudgeError as e:
        raise CLIError(str(e)) from None
    rate, se = win_rate(scores)
    result = {
        "model": model,
        "baseline": baseline,
        "judge": url,
        "prompts": len(prompts),
        "win_rate": rate,
        "standard_error": se,
        "malformed_verdicts": judge.malformed,
        "retries": judge.retries,
    }
    out_dir = out or _default_eval_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "scores.json").write_text(json.dumps(result, indent=2))
    with open(out_dir / f"{ARENA_HARD}.jsonl", "w") as f:
        for prompt, a, b, score in zip(prompts, *answers, scores):
            f.write(json.dumps({"prompt": prompt, "model": a, "baseline": b, "score": score}) + "\n")
    if as_json:
        typer.echo(json.dumps(result))
        return
    console.print(
        f"arena_hard: {model} vs {baseline}: win rate {rate:.3f} ± {se or 0:.3f} over {len(prompts)} "
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


def _eval_split(loaded, model: str, as_json: bool) -> None:
    """Every recipe domain's eval split (the recipe's `eval.split`), scored as a run's evals score it: the primary
    metric per domain and `greedy/<domain>` beside it."""
    from cascade.stages.evals.evaluate import evaluate_model  # after the checks: it imports torch and transformers

    with progress_bars(as_json) as bar_for:  # a column of a real model's split takes minutes: each has its bar
        scores, _ = evaluate_model(loaded, progress=bar_for, announce=None if as_json else _announce)
    if as_json:
        typer.echo(json.dumps({"model": model, "scores": scores}))
        return
    table = Table(
        "domain",
        "score",
        title=f"{loaded.eval.split} split: {model}",
        caption="each domain: the mean grade of k answers sampled at its RL temperature; "
        "greedy/<domain>: greedy pass@1",
    )
    for d, s in scores.items():
        table.add_row(d, f"{s:.3f}")
    console.print(table)


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


def _benchmark_specs(benchmark: str, data: str | None):
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


@app.command("grade")
@guarded
def grade_cmd(
    benchmark: str | None = typer.Option(
        None, "--benchmark", help="The benchmark (or domain) whose grader to use (required)."
    ),
    data: str | None = typer.Option(
        None,
        "--data",
        help="Completions to score (required): " + DATA_FORMAT_HELP + " Every row also "
        'needs "completion": the model\'s answer as a string.',
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Score completions made elsewhere. A bad row is reported with its line number and reason, and the other
    rows are still graded; the exit code is 1 when any row could not be graded."""
    from cascade.stages.domains.benchdata import BenchmarkError
    from cascade.stages.evals.benchmarks import grade_rows

    if not benchmark or data is None:  # checked here, not by typer, so the error is one line like the others
        raise CLIError("grade needs --benchmark NAME and --data FILE.jsonl")
    if "," in benchmark:
        raise CLIError("grade takes one --benchmark")
    _benchmark_specs(benchmark, data)  # unknown name or missing file: one line, exit 2
    try:
        result = grade_rows(benchmark, data)
    except BenchmarkError as e:
        raise CLIError(str(e)) from None
    if not result.rows and not result.errors:
        raise CLIError(f"{data} holds no items")
    if as_json:
        verdicts = [
            {k: row[k] for k in ("row", "id", "score", "verdict", "details") if k in row} for row in result.rows
        ]
        typer.echo(
            json.dumps({"benchmark": benchmark, "scores": result.metrics, "errors": result.errors, "rows": verdicts})
        )
    else:
        table = Table("metric", "score", title=f"{benchmark}: {len(result.rows)} graded, {len(result.errors)} bad rows")
        for key, value in result.metrics.items():
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)
        for err in result.errors:
            typer.echo(f"cascade: row {err['row']}: {err['error']}", err=True)
    if result.errors:
        raise typer.Exit(1)
