"""`cascade eval | grade`: a model on the held-out splits or real benchmarks; completions made elsewhere.

`cascade eval` parses its options and hands them to its mode (flows/cli/eval_modes.py): every recipe domain's eval
split without --benchmark, a benchmark a judge scores (the benchmark registry's JUDGED_BENCHMARKS,
stages/domains/benchdata.py) with --judge, else the named benchmarks, graded by their domains.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from cascade.flows.cli.common import CLIError, app, console, guarded
from cascade.flows.cli.eval_modes import EvalOptions, benchmark_specs, eval_benchmarks, eval_judged, eval_splits

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
    from cascade.stages.domains.benchdata import JUDGED_BENCHMARKS

    _use_threads(threads)
    options = EvalOptions(
        model=model,
        recipe=recipe,
        benchmark=benchmark,
        limit=limit,
        samples=samples,
        data=data,
        out=out,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        batch_size=batch_size,
        engine_kind=engine_kind,
        judge=judge,
        judge_model=judge_model,
        judge_key_env=judge_key_env,
        baseline=baseline,
        as_json=as_json,
    )
    judged = JUDGED_BENCHMARKS.get(benchmark) if benchmark is not None else None  # its registry entry says so
    if (judged is not None) != (judge is not None):
        names = " or ".join(JUDGED_BENCHMARKS)
        raise CLIError(f"--benchmark {names} needs --judge URL, and --judge applies to it only")
    if judged is not None:
        eval_judged(judged, options)
    elif benchmark is None:
        eval_splits(options)
    else:
        eval_benchmarks(options)


def _use_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise CLIError(f"--threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)


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
    benchmark_specs(benchmark, data)  # unknown name or missing file: one line, exit 2
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
