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

app = typer.Typer(add_completion=False, no_args_is_help=False, help="Cascade: multi-stage post-training on Prefect.")
console = Console()
RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,80}$")


class CLIError(Exception):
    """Bad user input: printed as one line, exit code 2."""


def _quiet_services() -> None:
    import logging

    logging.getLogger("mlflow").setLevel(logging.WARNING)
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
        from stages.recipe import RecipeError

        try:
            return fn(*args, **kwargs)
        except (CLIError, RecipeError) as e:
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
    from flows.cascade import cascade_flow
    from tasks.progress import set_progress_factory

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
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
    from stages.recipe import load_recipe

    loaded = load_recipe(recipe, overrides or [])
    run_id = run_id or new_run_id(loaded.name)
    if not RUN_ID.match(run_id):
        raise CLIError(f"bad run id {run_id!r}: use lowercase letters, digits, '.', '_' and '-'")
    store = _store_for(loaded.storage.resolved_root())
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
    loaded = _stored_recipe(_store_for(store), run_id)
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


@app.command("eval")
@_guarded
def eval_cmd(
    model: str = typer.Argument(..., help="A checkpoint URI/dir (with MANIFEST.json), an HF model dir, or 'tiny'."),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains and held-out sizes to use."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate a model on every domain's held-out split."""
    import tempfile

    from stages.recipe import load_recipe

    loaded = load_recipe(recipe)
    ref, store, model_cfg = _resolve_model(model)
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


def main() -> None:
    app(prog_name="cascade")


if __name__ == "__main__":
    sys.exit(main())
