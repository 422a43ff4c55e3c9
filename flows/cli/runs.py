"""`cascade run | resume`: start and continue runs (what a run left is read by flows/cli/inspection.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cascade.artifacts.layout import valid_run_id
from cascade.flows.cli.common import (
    CLIError,
    app,
    console,
    flow_logs,
    guarded,
    quiet_services,
    store_for,
    stored_recipe,
)
from cascade.flows.cli.inspection import print_matrix, stage_positions


def new_run_id(recipe_name: str) -> str:
    return f"{recipe_name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}".lower()


def execute(recipe, run_id: str) -> None:
    """The cascade flow in this process, with a progress bar per stage; then the forgetting matrix."""
    from cascade.infra.prefect_server import LocalAPI

    api = LocalAPI()  # started now, when no PREFECT_API_URL is configured: its start-up overlaps these imports
    from cascade.artifacts.home import cascade_home
    from cascade.artifacts.layout import report_key
    from cascade.artifacts.store import Store
    from cascade.flows.cascade import cascade_flow
    from cascade.stages.kinds import gain_targets
    from cascade.tasks.progress import set_progress_factory

    bars_or_lines = (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        if console.is_terminal
        else contextlib.nullcontext()
    )
    with api, bars_or_lines as progress:
        if api.embedded:
            # One run in this process, its stages one after another: no slot to take. (A limit on the embedded
            # server is shared through PREFECT_HOME's database with every other `cascade run` on the host, which
            # then waited, silently, for each other's training stages; a missing one is a Prefect warning.)
            from cascade.tasks.stage import COMPUTE_LIMIT_ENV, NO_COMPUTE_LIMIT

            os.environ[COMPUTE_LIMIT_ENV] = NO_COMPUTE_LIMIT
        bars: dict[str, Any] = {}

        def factory(label: str, unit: str):
            def update(done: int, total: int) -> None:
                if label not in bars:
                    bars[label] = progress.add_task(label, total=total)
                progress.update(bars[label], completed=done, total=total)

            return update

        set_progress_factory(factory if progress is not None else progress_lines(console))
        try:
            with flow_logs(cascade_home() / "logs" / f"{run_id}.log"):
                report = cascade_flow(recipe, run_id)
        finally:
            set_progress_factory(None)
    print_matrix(report, Store.from_config(recipe.storage), gain_targets(recipe.stages))
    console.print(f"report: {Store.from_config(recipe.storage).uri(report_key(run_id))}")


# Without a terminal (nohup, a redirect, CI) a stage's progress is a plain line: its first step, then at most one
# line per interval, and its last.
PROGRESS_LINE_EVERY_S = 30.0


def progress_lines(console: Any, every: float = PROGRESS_LINE_EVERY_S):
    """A progress factory that prints `<stage>: <done>/<total> <unit>, <elapsed>` lines (a training stage's steps,
    a difficulty filter's prompts; an eval's benchmark: `eval <stage>: <benchmark>: <done>/<total> items`), for a
    console that is not a terminal (where rich draws its bars only once, at the end)."""
    shown: dict[str, float] = {}
    started: dict[str, float] = {}

    def factory(label: str, unit: str):
        def update(done: int, total: int) -> None:
            now = time.monotonic()
            started.setdefault(label, now)
            if label in shown and done < total and now - shown[label] < every:
                return
            shown[label] = now
            elapsed = int(now - started[label])
            console.print(f"{label}: {done}/{total} {unit}, {elapsed // 60}:{elapsed % 60:02d}", highlight=False)

        return update

    return factory


@app.command()
@guarded
def run(
    recipe: str = typer.Argument("tiny", help="A shipped recipe name (e.g. tiny) or a path to a YAML file."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides, e.g. stages.sft.steps=100"),
    run_id: str | None = typer.Option(None, "--run-id", help="Name the run (default: RECIPE-DATE-TIME-XXXX)."),
) -> None:
    """Run a recipe end to end."""
    from cascade.artifacts.layout import recipe_key, run_dir
    from cascade.artifacts.lease import hold_run
    from cascade.artifacts.store import Store
    from cascade.artifacts.tracking import tracking_on
    from cascade.flows.recipes import load_recipe
    from cascade.stages.scale.host import check_host

    loaded = load_recipe(recipe, overrides or [])
    check_host(loaded)
    run_id = new_run_id(loaded.name) if run_id is None else run_id  # an empty --run-id is refused below
    if not valid_run_id(run_id):
        raise CLIError(f"bad run id {run_id!r}: use lowercase letters, digits, '.', '_' and '-'")
    # the stored recipe names its store, so `cascade resume` finds the run wherever the environment points
    loaded = loaded.model_copy(
        update={"storage": loaded.storage.model_copy(update={"root": loaded.storage.resolved_root()})}
    )
    store = Store.from_config(loaded.storage)
    if store.exists(recipe_key(run_id)):
        raise CLIError(f"run {run_id!r} already exists; continue it with `cascade resume {run_id}`")
    tracking_on(loaded.tracking)  # before the lease: a tracking server that does not answer is one line
    quiet_services()
    with hold_run(store, run_id):  # before anything of the run is written: a racing writer is refused here
        if store.exists(recipe_key(run_id)):
            raise CLIError(f"run {run_id!r} already exists; continue it with `cascade resume {run_id}`")
        console.print(f"run {run_id}: recipe {loaded.name}, store {store.uri(run_dir(run_id))}")
        execute(loaded, run_id)


@app.command()
@guarded
def resume(
    run_id: str = typer.Argument(..., help="The run to continue."),
    overrides: list[str] | None = typer.Argument(
        None, help="compute.* overrides for the stages still to run, e.g. compute.nnodes=1"
    ),
    store: str | None = typer.Option(None, "--store", help="Store root (default: $CASCADE_STORE or $CASCADE_HOME)."),
) -> None:
    """Continue a run: committed stages are skipped, a cut-off stage resumes from its last step checkpoint (on
    another number of ranks or nodes, with compute.* overrides)."""
    from cascade.artifacts.lease import hold_run
    from cascade.artifacts.store import Store
    from cascade.artifacts.tracking import tracking_on
    from cascade.stages.scale.host import check_host

    found = store_for(store)
    loaded = stored_recipe(found, run_id, overrides or [])
    check_host(loaded)
    began = Store.from_config(loaded.storage).uri("")
    if began != found.uri(""):  # the store was moved since the run began
        console.print(
            f"{run_id} began in {began} and is in {found.uri('')} now: it continues there",
            highlight=False,
            soft_wrap=True,
        )
        loaded = loaded.model_copy(update={"storage": loaded.storage.model_copy(update={"root": found.uri("")})})
    tracking_on(loaded.tracking)
    quiet_services()
    with hold_run(Store.from_config(loaded.storage), run_id):  # refused before paying Prefect start-up
        console.print(f"resuming {run_id}")
        for name, where, _ in stage_positions(Store.from_config(loaded.storage), run_id, loaded):
            console.print(f"  {name}: {where}", highlight=False)
        execute(loaded, run_id)
