"""`cascade`: run, resume, inspect and evaluate cascades from the terminal.

Bad input (unknown recipe key, missing file, bad override, unknown run id) is one line on stderr and exit
code 2, checked before anything is written.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from stages.recipe import RUN_ID_PATTERN

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Cascade: multi-stage post-training on Prefect.")
console = Console()
RUN_ID = re.compile(RUN_ID_PATTERN)


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


def _quiet_services() -> None:
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")  # 2 busy cores: 20 s is short
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _fail(message: str) -> None:
    typer.echo(f"cascade: error: {message}", err=True)
    raise typer.Exit(2)


def _guarded(fn):
    """Turn known bad-input errors into one line on stderr and exit 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from artifacts.lease import LeaseHeld
        from artifacts.store import StoreError
        from stages.recipe import RecipeError

        try:
            return fn(*args, **kwargs)
        except (CLIError, RecipeError, LeaseHeld, StoreError) as e:
            _fail(str(e))

    return wrapper


def new_run_id(recipe_name: str) -> str:
    return f"{recipe_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}".lower()


def _store_for(root: str | None):
    from artifacts.store import Store
    from stages.recipe import StorageConfig

    return Store.from_config(StorageConfig(root=root))


def _stored_recipe(store, run_id: str):
    from stages.recipe import validate_recipe

    key = f"runs/{run_id}/recipe.json"
    if not RUN_ID.match(run_id) or not store.exists(key):
        raise CLIError(f"unknown run id {run_id!r} in {store.uri('runs')}")
    return validate_recipe(json.loads(store.read_bytes(key)), source=store.uri(key))


def _execute(recipe, run_id: str) -> None:
    from infra.prefect_server import LocalAPI

    api = LocalAPI()  # started now, when no PREFECT_API_URL is configured: its start-up overlaps these imports
    from flows.cascade import cascade_flow
    from tasks.progress import set_progress_factory

    with api, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=False) as progress:
        bars: dict[str, Any] = {}

        def factory(label: str):
            def update(done: int, total: int) -> None:
                if label not in bars:
                    bars[label] = progress.add_task(label, total=total)
                progress.update(bars[label], completed=done, total=total)

            return update

        set_progress_factory(factory)
        try:
            report = cascade_flow(recipe, run_id)
        finally:
            set_progress_factory(None)
    print_matrix(report)
    console.print(f"report: {_store_for(recipe.storage.resolved_root()).uri(f'runs/{run_id}/report.json')}")


def print_matrix(report) -> None:
    domains, rows = report.forgetting_matrix()
    table = Table(title=f"Forgetting matrix: held-out score after each stage ({report.run_id})")
    table.add_column("after stage")
    for d in domains:
        table.add_column(d, justify="right")
    for stage, scores in rows:
        table.add_row(stage, *("-" if s is None else f"{s:.3f}" for s in scores))
    console.print(table)
    for g in report.gate:
        console.print(f"gate: {g['domain']} fell {g['drop']:.3f} after {g['stage']} "
                      f"(best {g['best']:.3f}, tolerance {g['tolerance']}): {g['action']}")


@app.command()
@_guarded
def run(
    recipe: str = typer.Argument("tiny", help="A shipped recipe name (e.g. tiny) or a path to a YAML file."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key=value overrides, e.g. stages.sft.steps=100"),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Name the run (default: RECIPE-DATE-TIME-XXXX)."),
) -> None:
    """Run a recipe end to end."""
    from artifacts.store import Store
    from stages.recipe import load_recipe

    loaded = load_recipe(recipe, overrides or [])
    run_id = run_id or new_run_id(loaded.name)
    if not RUN_ID.match(run_id):
        raise CLIError(f"bad run id {run_id!r}: use lowercase letters, digits, '.', '_' and '-'")
    store = Store.from_config(loaded.storage)  # the recipe's endpoint, region and profile too
    if store.exists(f"runs/{run_id}/recipe.json"):
        raise CLIError(f"run {run_id!r} already exists; continue it with `cascade resume {run_id}`")
    _quiet_services()
    store.write_bytes(f"runs/{run_id}/recipe.json", loaded.model_dump_json(indent=1).encode())
    console.print(f"run [bold]{run_id}[/bold]: recipe {loaded.name}, store {store.uri(f'runs/{run_id}')}")
    _execute(loaded, run_id)


@app.command()
@_guarded
def resume(
    run_id: str = typer.Argument(..., help="The run to continue."),
    store: Optional[str] = typer.Option(None, "--store", help="Store root (default: $CASCADE_STORE or $CASCADE_HOME)."),
) -> None:
    """Continue a run: committed stages are skipped, a cut-off stage resumes from its last step checkpoint."""
    from artifacts.lease import describe, is_live, read_lease

    st = _store_for(store)
    loaded = _stored_recipe(st, run_id)
    held = read_lease(st, run_id)
    if is_live(held):  # refuse before paying Prefect start-up
        raise CLIError(f"run {run_id!r} is being written by another process: {describe(held)}")
    _quiet_services()
    console.print(f"resuming [bold]{run_id}[/bold]")
    _execute(loaded, run_id)


@app.command()
@_guarded
def status(
    run_id: Optional[str] = typer.Argument(None, help="A run id; without it, every run in the store."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    store: Optional[str] = typer.Option(None, "--store"),
) -> None:
    """Show runs, or one run's stages, evals and gate decisions."""
    from artifacts.report import RunReport

    st = _store_for(store)
    if run_id is None:
        runs = [r for r in st.list_dirs("runs") if st.exists(f"runs/{r}/recipe.json")]
        reports = [RunReport.load(st, r) for r in runs]
        summary = [{"run_id": r, "stages": [[s["name"], s["status"]] for s in rep.stages] if rep else []}
                   for r, rep in zip(runs, reports)]
        if as_json:
            typer.echo(json.dumps(summary))
            return
        table = Table("run id", "stages")
        for row in summary:
            table.add_row(row["run_id"], ", ".join(f"{n}:{s}" for n, s in row["stages"]) or "(not started)")
        console.print(table)
        return
    recipe = _stored_recipe(st, run_id)
    report = RunReport.load(st, run_id) or RunReport(run_id=run_id, recipe=recipe.name)
    if as_json:
        typer.echo(report.model_dump_json())
        return
    table = Table("stage", "kind", "status", "seconds", "checkpoint", title=f"run {run_id}")
    done = {s["name"]: s for s in report.stages}
    for cfg in recipe.stages:
        s = done.get(cfg.name, {})
        table.add_row(cfg.name, cfg.kind, s.get("status", "pending"), str(s.get("seconds", "")), s.get("checkpoint") or "")
    console.print(table)
    print_matrix(report)


@app.command()
@_guarded
def report(
    run_id: str = typer.Argument(...),
    store: Optional[str] = typer.Option(None, "--store"),
) -> None:
    """Print a run's forgetting matrix and gate decisions."""
    from artifacts.report import RunReport

    st = _store_for(store)
    _stored_recipe(st, run_id)
    rep = RunReport.load(st, run_id)
    if rep is None:
        raise CLIError(f"run {run_id!r} has no report yet")
    print_matrix(rep)


BENCHMARK_HELP = "Comma-separated real benchmarks, e.g. gsm8k,ifeval,humaneval,mbpp,mmlu_stem,bfcl_simple."
DATA_FORMAT_HELP = (
    "JSONL, one item per line, in the benchmark's own format (gsm8k: question + answer ending '#### N'; "
    "aime24/amc23: problem + answer; mmlu_stem: question + choices + answer index; ifeval: prompt + "
    "instruction_id_list + kwargs) or, for any benchmark, in the item format "
    '{"prompt": "...", "meta": {...}, "reference": "...", "id": "..."}, where meta is what the domain\'s grader '
    "reads (math: answer; mcqa: answer letter; longctx: answer; instruct: kind, n, word or IFEval's fields). "
    "With --data, --benchmark may also name a domain (math, mcqa, ...) for item-format rows."
)
NAMED_MODELS = ("smollm2-135m",)  # model sources that are names, not paths (stages.model resolves them)


@app.command("eval")
@_guarded
def eval_cmd(
    model: str = typer.Argument(..., help="A checkpoint URI/dir (with MANIFEST.json), an HF model dir, 'tiny' or "
                                          "'smollm2-135m'."),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains and held-out sizes to use."),
    benchmark: Optional[str] = typer.Option(None, "--benchmark", help=BENCHMARK_HELP + " Without it: every "
                                            "recipe domain's held-out split."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Only the first N items of each benchmark."),
    samples: int = typer.Option(1, "--samples", help="Completions per item: 1 is greedy pass@1; K > 1 samples "
                                "(T=0.8 unless --temperature) and adds unbiased pass@K."),
    data: Optional[Path] = typer.Option(None, "--data", help="Your own items instead of the benchmark's file: "
                                        + DATA_FORMAT_HELP),
    out: Optional[Path] = typer.Option(None, "--out", help="Directory for scores.json and <benchmark>.jsonl "
                                       "(prompt, completion, verdict per item); default $CASCADE_HOME/evals/<time>."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", help="Generation budget per completion."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="Sampling temperature override."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Sequences per generate call."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch CPU threads; on a busy machine 1 can be "
                                          "many times faster than oversubscribed OpenMP threads."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate a model on every domain's held-out split, or on real benchmarks with --benchmark."""
    if threads is not None:
        if threads < 1:
            raise CLIError(f"--threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    if benchmark is None:
        if limit is not None or samples != 1 or data is not None or out is not None:
            raise CLIError("--limit, --samples, --data and --out apply to --benchmark runs only")
        _eval_heldout(model, recipe, as_json)
        return
    specs = _benchmark_specs(benchmark, data)
    if data is not None:
        _check_items_file(specs[0], data)  # a bad row is reported before a model loads or a file is written
    for flag, value, low in (("--limit", limit, 1), ("--samples", samples, 1), ("--max-new-tokens", max_new_tokens, 1),
                             ("--batch-size", batch_size, 1)):
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low}, got {value}")
    if temperature is not None and temperature < 0:
        raise CLIError(f"--temperature must be >= 0, got {temperature}")
    _model, tokenizer, engine = _load_for_benchmarks(model, recipe, batch_size)
    settings = {"limit": limit, "samples": samples, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "data": str(data) if data else None}
    out_dir = out or _default_eval_dir()
    try:
        results = _run_benchmarks(engine, tokenizer, specs, settings, quiet=as_json,
                                  save=lambda done: _write_benchmark_results(out_dir, model, settings, done))
    finally:
        engine.close()
    _print_benchmark_scores(model, results, out_dir, as_json)


def _eval_heldout(model: str, recipe: str, as_json: bool) -> None:
    """Every recipe domain's held-out split, greedy pass@1 (the behaviour before --benchmark existed)."""
    import tempfile

    from stages.recipe import load_recipe

    loaded = load_recipe(recipe)
    ref, store, model_cfg = _resolve_any_model(model)
    if model_cfg is not None:
        loaded = loaded.model_copy(update={"model": model_cfg})
    from stages.context import ListSink, StageContext
    from stages.evaluate import run_evaluate

    ctx = StageContext(loaded, store, "eval", "eval", ListSink(), workdir=Path(tempfile.mkdtemp(prefix="cascade-eval-")))
    scores, _ = run_evaluate(ctx, ref)
    if as_json:
        typer.echo(json.dumps({"model": model, "scores": scores}))
        return
    table = Table("domain", "score", title=f"held-out pass@1: {model}")
    for d, s in scores.items():
        table.add_row(d, f"{s:.3f}")
    console.print(table)


def _resolve_any_model(model: str):
    """Like _resolve_model, plus the named sources (smollm2-135m), which stages.model converts and caches."""
    from stages.recipe import ModelConfig

    if model in NAMED_MODELS:
        return None, _store_for(None), ModelConfig(source=model)
    return _resolve_model(model)


def _benchmark_specs(benchmark: str, data: Optional[Path]):
    """The specs of comma-separated names; unknown names are a CLIError before any work."""
    from stages.benchmarks import BenchmarkError, resolve_benchmarks

    names = [n.strip() for n in benchmark.split(",") if n.strip()]
    try:
        return resolve_benchmarks(names, data)
    except BenchmarkError as e:
        raise CLIError(str(e)) from None


def _check_items_file(spec, data: Path) -> None:
    from stages.benchmarks import BenchmarkError, load_items

    try:
        if not load_items(spec, data_file=data):
            raise CLIError(f"{data} holds no items")
    except BenchmarkError as e:
        raise CLIError(str(e)) from None


def _load_for_benchmarks(model: str, recipe: str, batch_size: Optional[int]):
    """(model, tokenizer, engine) for a model name, HF dir or checkpoint, with the recipe's engine settings."""
    import tempfile

    from stages.context import ListSink, StageContext, load_policy
    from stages.engines import make_engine
    from stages.recipe import load_recipe

    loaded = load_recipe(recipe)
    ref, store, model_cfg = _resolve_any_model(model)
    if model_cfg is not None:
        loaded = loaded.model_copy(update={"model": model_cfg})
    ctx = StageContext(loaded, store, "eval", "eval", ListSink(), workdir=Path(tempfile.mkdtemp(prefix="cascade-eval-")))
    model_obj, tokenizer = load_policy(ctx, ref)
    engine_cfg = loaded.engine if batch_size is None else loaded.engine.model_copy(update={"batch_size": batch_size})
    return model_obj, tokenizer, make_engine(engine_cfg, model_obj, tokenizer, seed=loaded.seed)


def _run_benchmarks(engine, tokenizer, specs, settings: dict, quiet: bool, save) -> list:
    """Each benchmark in turn, with a progress bar per benchmark (on stderr, so --json stdout stays clean).

    `save(results so far)` runs after each benchmark, so a long multi-benchmark run keeps what it finished."""
    from stages.benchmarks import BenchmarkError, evaluate_benchmark

    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False, disable=quiet) as progress:
        for spec in specs:
            bar = progress.add_task(spec.name, total=None)

            def update(done: int, total: int, bar=bar) -> None:
                progress.update(bar, completed=done, total=total)

            try:
                results.append(evaluate_benchmark(
                    engine, tokenizer, spec.name, settings["limit"], settings["samples"],
                    data_file=settings["data"], max_new_tokens=settings["max_new_tokens"],
                    temperature=settings["temperature"], progress=update))
            except BenchmarkError as e:  # e.g. a bad row in --data: found before any generation
                raise CLIError(str(e)) from None
            save(results)
    return results


def _default_eval_dir() -> Path:
    from stages.recipe import cascade_home

    return cascade_home() / "evals" / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def _write_benchmark_results(out_dir: Path, model: str, settings: dict, results: list) -> None:
    """scores.json plus <benchmark>.jsonl (one row per item and sample) in the output directory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    scores = {"model": model, "settings": settings,
              "benchmarks": {r.name: {"domain": r.domain, "seconds": round(r.seconds, 1), **r.metrics} for r in results}}
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
            table.add_row(r.name if i == 0 else "", str(r.metrics["items"]) if i == 0 else "", key,
                          f"{r.metrics[key]:.3f}", f"{r.seconds:.0f}" if i == 0 else "")
    console.print(table)
    console.print(f"per-item results: {out_dir}")


@app.command("grade")
@_guarded
def grade_cmd(
    benchmark: Optional[str] = typer.Option(None, "--benchmark", help="The benchmark (or domain) whose grader to "
                                            "use (required)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Completions to score (required): " + DATA_FORMAT_HELP + " Every row also "
                              'needs "completion": the model\'s answer as a string.'),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Score completions made elsewhere. A bad row is reported with its line number and reason, and the other
    rows are still graded; the exit code is 1 when any row could not be graded."""
    from stages.benchmarks import BenchmarkError, grade_rows

    if not benchmark or data is None:  # checked here, not by typer, so the error is one line like the others
        raise CLIError("grade needs --benchmark NAME and --data FILE.jsonl")
    if "," in benchmark:
        raise CLIError("grade takes one --benchmark")
    _benchmark_specs(benchmark, data)  # unknown name or missing file: one line, exit 2
    try:
        result = grade_rows(benchmark, data)
    except BenchmarkError as e:
        raise CLIError(str(e)) from None
    if as_json:
        verdicts = [{k: row[k] for k in ("row", "id", "score", "verdict", "details") if k in row} for row in result.rows]
        typer.echo(json.dumps({"benchmark": benchmark, "scores": result.metrics, "errors": result.errors,
                               "rows": verdicts}))
    else:
        table = Table("metric", "score", title=f"{benchmark}: {len(result.rows)} graded, {len(result.errors)} bad rows")
        for key, value in result.metrics.items():
            table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
        console.print(table)
        for err in result.errors:
            typer.echo(f"cascade: row {err['row']}: {err['error']}", err=True)
    if result.errors:
        raise typer.Exit(1)


def _resolve_model(model: str):
    """(checkpoint ref or None, store, model config override or None)."""
    from artifacts.checkpoint import committed
    from artifacts.store import Store
    from stages.recipe import ModelConfig

    if model == "tiny":
        return None, _store_for(None), ModelConfig()
    local = Path(model)
    if local.is_dir() and (local / "config.json").exists():
        return None, _store_for(None), ModelConfig(source=str(local.resolve()))
    uri = model if "://" in model else f"file://{local.resolve()}"
    if "://" not in model and not local.exists():
        raise CLIError(f"no such model or checkpoint: {model}")
    store = Store(uri)
    ref = committed(store, "")
    if ref is None:
        raise CLIError(f"{model} is neither an HF model dir nor a committed checkpoint (no valid MANIFEST.json)")
    return ref, store, None


@app.command("gc")
@_guarded
def gc_cmd(
    run_ids: Optional[list[str]] = typer.Argument(None, help="Runs to clean (default: every run in the store)."),
    keep: int = typer.Option(2, "--keep", help="Committed step checkpoints kept per stage."),
    delete: bool = typer.Option(False, "--yes", help="Delete; without it, only show the plan."),
    store: Optional[str] = typer.Option(None, "--store"),
) -> None:
    """List (then with --yes delete) orphaned partial uploads and step checkpoints beyond the last K per stage."""
    from artifacts.gc import gc

    if keep < 1:
        raise CLIError(f"--keep must be >= 1, got {keep}")
    st = _store_for(store)
    for r in run_ids or []:
        _stored_recipe(st, r)
    typer.echo(gc(st, run_ids or None, keep_last=keep, delete=delete).render())


# --- Scheduled regression evals: `cascade regression-eval`, `cascade baseline set|show` (README) ---

baseline_app = typer.Typer(add_completion=False, help="Stored per-domain baselines of regression evals.")
app.add_typer(baseline_app, name="baseline")


def _regression_input(fn):
    """_guarded, plus the regression evals' own bad-input errors (bad baseline name or record, unknown checkpoint)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from stages.regression import BaselineError

        try:
            return fn(*args, **kwargs)
        except (BaselineError, LookupError) as e:
            raise CLIError(str(e)) from None

    return _guarded(wrapper)


@app.command("regression-eval")
@_regression_input
def regression_eval_cmd(
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains, tolerances and store to use."),
    checkpoints: Optional[list[str]] = typer.Option(None, "--checkpoint", help="A registry alias models:/<model>@"
                                                    "<alias>, a store URI or a store key; repeatable. Default: "
                                                    "the recipe's newest final-stage alias."),
    baseline: str = typer.Option("nightly", "--baseline", help="Baseline name (<store>/baselines/<name>.json)."),
    update_baseline: bool = typer.Option(False, "--update-baseline", help="Afterwards, raise each domain's "
                                         "baseline to this run's best score where higher."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate checkpoints against a stored baseline, locally; exit code 1 when any domain regressed."""
    from stages.recipe import load_recipe
    from stages.regression import baseline_key, regressions
    from tasks.regression import resolve_checkpoint

    from flows.regression_eval import default_checkpoints, regression_eval_flow
    from infra.prefect_server import LocalAPI

    loaded = load_recipe(recipe)
    baseline_key(baseline)
    names = checkpoints or default_checkpoints(loaded)
    for name in names:
        resolve_checkpoint(loaded, name)  # an unknown checkpoint is one line before Prefect starts
    _quiet_services()
    with LocalAPI():
        rows = regression_eval_flow(recipe, names, baseline, update_baseline)
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        table = Table("checkpoint", "domain", "score", "baseline", "drop", "tolerance", "verdict",
                      title=f"regression eval against baseline {baseline!r}")
        for r in rows:
            table.add_row(r["checkpoint"], r["domain"], f"{r['score']:.3f}",
                          *("-" if r[k] is None else str(r[k]) for k in ("baseline", "drop", "tolerance")), r["verdict"])
        console.print(table)
    if regressions(rows):
        raise typer.Exit(1)


@baseline_app.command("set")
@_regression_input
def baseline_set(
    name: str = typer.Argument(..., help="Baseline name, e.g. nightly."),
    source: str = typer.Argument(..., help="An eval record (.json: a store key such as runs/<id>/evals/01-sft.json, "
                                           "a store URI or a local file) or a checkpoint (alias, URI or store key), "
                                           "which is evaluated now."),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains and store to use."),
) -> None:
    """Replace a baseline: every domain's score and checkpoint from one eval."""
    from artifacts.store import Store
    from stages.recipe import load_recipe
    from stages.regression import baseline_key, replace, save_baseline

    loaded = load_recipe(recipe)
    baseline_key(name)
    store = Store.from_config(loaded.storage)
    record = _eval_record(loaded, store, source)
    save_baseline(store, replace(name, record))
    _print_baseline(store, name)


@baseline_app.command("show")
@_regression_input
def baseline_show(
    name: str = typer.Argument(...),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose store holds the baseline."),
) -> None:
    """Print a baseline: per domain, the score and the checkpoint that earned it."""
    from artifacts.store import Store
    from stages.recipe import load_recipe

    _print_baseline(Store.from_config(load_recipe(recipe).storage), name)


def _eval_record(recipe, store, source: str) -> dict:
    """The eval record a baseline is set from: read (a .json record) or made now (a checkpoint)."""
    from stages.regression import read_eval_record
    from tasks.regression import resolve_checkpoint

    if source.endswith(".json"):
        local, root = Path(source), store.uri("") + "/"
        if "://" not in source and local.is_file():
            return read_eval_record(local.read_bytes(), source)
        key = source.removeprefix(root)
        if "://" in key or not store.exists(key):
            raise CLIError(f"no eval record {source} (a local file, or a key or URI in {store.uri('')})")
        return read_eval_record(store.read_bytes(key), source)
    import tempfile

    from stages.context import ListSink, StageContext
    from stages.evaluate import run_evaluate

    ref = resolve_checkpoint(recipe, source)
    ctx = StageContext(recipe, store, "baseline", "baseline", ListSink(), workdir=Path(tempfile.mkdtemp(prefix="cascade-eval-")))
    scores, _ = run_evaluate(ctx, ref)
    return {"checkpoint": source, "model": ref.uri, "digest": ref.digest, "scores": scores}


def _print_baseline(store, name: str) -> None:
    from stages.regression import load_baseline

    baseline = load_baseline(store, name)
    if baseline is None:
        raise CLIError(f"no baseline {name!r} in {store.uri('baselines')}")
    table = Table("domain", "score", "checkpoint", title=f"baseline {name} ({store.uri(f'baselines/{name}.json')})")
    for domain, entry in sorted(baseline.domains.items()):
        table.add_row(domain, f"{entry.score:.3f}", entry.checkpoint)
    console.print(table)

@app.command()
@_guarded
def deploy(
    port: Optional[int] = typer.Option(None, "--port", help="Port of the Prefect server started when no "
                                       "PREFECT_API_URL is configured (default: a free one)."),
    limit: str = typer.Option("", "--limit", help="Global concurrency limit of training stages (default: "
                              "$CASCADE_COMPUTE_LIMIT or `compute`; `gpu` on GPU clusters)."),
    serve: bool = typer.Option(True, "--serve/--no-serve", help="Serve the deployments here (default), or "
                               "only register them (for a worker or `prefect deploy` setup)."),
) -> None:
    """Register the deployments (infra/deployments.py) with Prefect and serve them; print the UI URL.

    Without a configured PREFECT_API_URL, starts a local Prefect server (PREFECT_HOME=$CASCADE_HOME/prefect)
    and stops it on exit."""
    from infra.deploy import deploy as deploy_all
    from stages.recipe import cascade_home
    from tasks.stages import compute_limit_name

    if port is not None and not 0 < port < 65536:
        raise CLIError(f"--port must be in 1..65535, got {port}")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")  # flow-run logs in the UI, runner events here
    _quiet_services()
    deploy_all(cascade_home() / "prefect", port, limit or compute_limit_name(), serve,
               say=lambda line: console.print(line, highlight=False, soft_wrap=True))


def main() -> None:
    app(prog_name="cascade")


if __name__ == "__main__":
    sys.exit(main())
