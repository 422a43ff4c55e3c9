"""`cascade run | resume | status | verify | report | gc`: start, continue, inspect, check and clean up runs."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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

        def factory(label: str):
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


def print_matrix(report, store=None, targets: dict[str, list[str]] | None = None) -> None:
    """The matrix; with the run's store, each cell also gets its standard error (± over the held-out items), and
    each RL stage in `targets` (stage -> the domains it trains) its gains table. Wider than the terminal (a
    recipe with many domains), the matrix's columns go into several tables, never cut."""
    from cascade.artifacts.html_report import item_scores, stage_gains, standard_error
    from cascade.artifacts.report import GREEDY_COLUMN

    domains, rows = report.forgetting_matrix()
    items = item_scores(store, report.run_id) if store is not None else {}

    def cell(stage: str, domain: str, score: float | None) -> str:
        if score is None:
            return "-"
        se = standard_error(items.get(stage, {}).get(domain, {}).values())
        return f"{score:.3f}" if se is None else f"{score:.3f} ± {se:.3f}"

    cells = [[cell(stage, d, s) for d, s in zip(domains, scores)] for stage, scores in rows]
    stage_width = max([len("after stage")] + [len(stage) for stage, _ in rows]) + 4
    widths = [max([len(d)] + [len(r[i]) for r in cells]) + 3 for i, d in enumerate(domains)]
    for part in column_groups(widths, console.width - stage_width):
        table = Table(title=f"Forgetting matrix: eval score after each stage ({report.run_id})")
        table.add_column("after stage", no_wrap=True)
        for i in part:
            table.add_column(domains[i], justify="right", no_wrap=True)
        for (stage, _), row in zip(rows, cells):
            table.add_row(stage, *(row[i] for i in part))
        console.print(table)
    if any(d.startswith(GREEDY_COLUMN) for d in domains):
        console.print(
            "each domain: the mean grade of k answers sampled at its RL temperature (the primary metric, "
            "gated); greedy/<domain>: greedy pass@1 beside it; pass@k/<domain>: the share of items with a fully "
            "right answer among the same k"
        )
    for g in report.gate:
        console.print(
            f"gate: {g['domain']} fell {g['drop']:.3f} after {g['stage']} "
            f"(best {g['best']:.3f}, tolerance {g['tolerance']}): {g['action']}"
        )
    gains = stage_gains([stage for stage, _ in rows], items, targets or {})
    if gains:
        table = Table(
            "stage",
            "domain",
            "before",
            "after",
            "paired gain",
            "in SE",
            title="Gains of each RL stage on its own domains",
        )
        for g in gains:
            table.add_row(
                g.stage,
                g.domain,
                f"{g.before:.3f}",
                f"{g.after:.3f}",
                f"{g.gain:+.3f} ± {g.se:.3f}" if g.se else f"{g.gain:+.3f}",
                f"{g.in_se:+.1f}" if g.in_se is not None else "-",
            )
        console.print(table)


def column_groups(widths: list[int], room: int) -> list[list[int]]:
    """Consecutive column indices per table so each table's columns fit `room` characters (at least one each)."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, width in enumerate(widths):
        if groups[-1] and used + width > room:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += width
    return groups


# Without a terminal (nohup, a redirect, CI) a stage's progress is a plain line: its first step, then at most one
# line per interval, and its last.
PROGRESS_LINE_EVERY_S = 30.0


def progress_lines(console: Any, every: float = PROGRESS_LINE_EVERY_S):
    """A progress factory that prints `<stage>: <done>/<total> steps, <elapsed>` lines (an eval's benchmark:
    `eval <stage>: <benchmark>: <done>/<total> items`), for a console that is not a terminal (where rich draws its
    bars only once, at the end)."""
    shown: dict[str, float] = {}
    started: dict[str, float] = {}

    def factory(label: str):
        def update(done: int, total: int) -> None:
            now = time.monotonic()
            started.setdefault(label, now)
            if label in shown and done < total and now - shown[label] < every:
                return
            shown[label] = now
            elapsed = int(now - started[label])
            unit = "items" if label.startswith("eval ") else "steps"  # an eval's benchmark answers items
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
    from cascade.stages.host import check_host

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
    from cascade.stages.host import check_host

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


def stage_positions(store, run_id: str, recipe) -> list[tuple[str, str, int | None]]:
    """Where each stage of a run stands, as a resume takes it up: (name, what a resume does, the step it continues
    from): committed (skipped), continuing from its newest step checkpoint under its config, or starting."""
    from cascade.artifacts.checkpoint import committed, committed_steps
    from cascade.artifacts.config import config_hash
    from cascade.artifacts.layout import stage_key

    positions = []
    for index, cfg in enumerate(recipe.stages):
        key = stage_key(run_id, index, cfg.name)
        steps = committed_steps(store, key, config_hash(cfg))
        if committed(store, key) is not None:
            positions.append((cfg.name, "committed, skipped", None))
        elif steps:
            of = getattr(cfg, "steps", "?")
            positions.append((cfg.name, f"continues from its step checkpoint {steps[-1]} of {of}", steps[-1]))
        else:
            positions.append((cfg.name, "starts", None))
    return positions


def _load_report(st, run_id: str):
    """The run's report; an unreadable one (a truncated write) is reported, not fatal for the listing."""
    from pydantic import ValidationError

    from cascade.artifacts.layout import report_key
    from cascade.artifacts.report import RunReport

    try:
        return RunReport.load(st, run_id)
    except (ValidationError, ValueError, UnicodeDecodeError):
        raise CLIError(f"{st.uri(report_key(run_id))} is not a valid report (truncated?)") from None


@app.command()
@guarded
def status(
    run_id: str | None = typer.Argument(None, help="A run id; without it, every run in the store."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    store: str | None = typer.Option(None, "--store"),
) -> None:
    """Show runs, or one run's stages, evals and gate decisions."""
    from cascade.artifacts.layout import RUNS, recipe_key
    from cascade.artifacts.report import RunReport
    from cascade.stages.kinds import gain_targets

    st = store_for(store)
    if run_id is None:
        summary = []
        for r in (r for r in st.list_dirs(RUNS) if st.exists(recipe_key(r))):
            try:
                rep = _load_report(st, r)
                stages = [[s["name"], s["status"]] for s in rep.stages] if rep else []
            except CLIError as e:
                stages = [["report", f"unreadable ({e})"]]
            summary.append({"run_id": r, "stages": stages})
        if as_json:
            typer.echo(json.dumps(summary))
            return
        table = Table("run id", "stages")
        for row in summary:
            table.add_row(row["run_id"], ", ".join(f"{n}:{s}" for n, s in row["stages"]) or "(not started)")
        console.print(table)
        return
    recipe = stored_recipe(st, run_id)
    report = _load_report(st, run_id) or RunReport(run_id=run_id, recipe=recipe.name)
    if as_json:
        typer.echo(report.model_dump_json())
        return
    console.print(run_process(st, run_id, report), highlight=False)
    table = Table("stage", "kind", "status", "seconds", "checkpoint", title=f"run {run_id}")
    done = {s["name"]: s for s in report.stages}
    resumes_at = {name: step for name, _, step in stage_positions(st, run_id, recipe)}
    for index, cfg in enumerate(recipe.stages):
        s = done.get(cfg.name, {})
        status = stage_status(st, run_id, index, cfg.name, s.get("status", "pending"))
        if resumes_at[cfg.name] is not None:  # a stage cut off mid-way: where a resume takes it up
            status = f"{status} (step checkpoint {resumes_at[cfg.name]})"
        table.add_row(cfg.name, cfg.kind, status, str(s.get("seconds", "")), s.get("checkpoint") or "")
    console.print(table)
    print_matrix(report, st, gain_targets(recipe.stages))


def run_process(store, run_id: str, report) -> str:
    """Whether a process is running the run now: its lease's owner, alive or gone."""
    from cascade.artifacts.lease import describe, is_live, owner_gone, read_lease

    lease = read_lease(store, run_id)
    if lease is not None and is_live(lease):
        return f"running: {describe(lease)}"
    if lease is not None:
        why = "its process is gone" if owner_gone(lease) else "its lease expired"
        return f"not running: {why} ({describe(lease)}); `cascade resume {run_id}` continues it"
    if report.status is None or report.status == "FAILED":
        return f"not running; `cascade resume {run_id}` continues it"
    return f"not running: {report.status.lower()}"


def stage_status(store, run_id: str, index: int, name: str, recorded: str) -> str:
    """The report's status, unless the checkpoint in the store says otherwise: a torn manifest or a file of the
    wrong size is `damaged` (sizes only, one listing; `cascade verify` hashes every file)."""
    from cascade.artifacts.checkpoint import damaged
    from cascade.artifacts.layout import stage_key

    problems = damaged(store, stage_key(run_id, index, name), hashes=False)
    return f"damaged: {problems[0]}" if problems else recorded


@app.command()
@guarded
def verify(
    run_id: str = typer.Argument(..., help="The run whose checkpoints to check."),
    store: str | None = typer.Option(None, "--store"),
) -> None:
    """Hash every file of every checkpoint of a run (stages and their step checkpoints) against its manifest;
    a line per damaged checkpoint, exit code 1 if any."""
    from cascade.artifacts.checkpoint import verify_run
    from cascade.artifacts.layout import run_dir

    st = store_for(store)
    if not valid_run_id(run_id) or not st.list_dirs(run_dir(run_id)):
        raise CLIError(f"unknown run id {run_id!r} in {st.uri('runs')}")
    found = verify_run(st, run_id)
    for key, problems in found.items():
        typer.echo(f"damaged {st.uri(key)}: {'; '.join(problems)}", err=True)
    if found:
        raise typer.Exit(1)
    console.print(f"run {run_id}: every checkpoint verifies")


@app.command()
@guarded
def report(
    run_ids: list[str] = typer.Argument(..., help="A run id; two run ids put both runs side by side."),
    html: str | None = typer.Option(
        None,
        "--html",
        is_flag=False,
        flag_value="",
        metavar="[PATH]",
        help="Write the HTML report to PATH; `--html` alone: report.html beside report.json in the store.",
    ),
    store: str | None = typer.Option(None, "--store"),
) -> None:
    """Print a run's forgetting matrix and gate decisions; with --html, write the HTML run report."""
    from cascade.stages.kinds import gain_targets

    if len(run_ids) > 2:
        raise CLIError(f"report takes one run id, or two to compare; got {len(run_ids)}")
    target = Path(html) if html else None
    if target is not None:
        _check_writable(target)
    st = store_for(store)
    recipes = [stored_recipe(st, r) for r in run_ids]
    reports = []
    for r in run_ids:
        rep = _load_report(st, r)
        if rep is None:
            raise CLIError(f"run {r!r} has no report yet")
        reports.append(rep)
    for rep, rec in zip(reports, recipes):
        print_matrix(rep, st, gain_targets(rec.stages))
    if html is None:
        return
    from cascade.artifacts.html_report import collect, render
    from cascade.artifacts.layout import html_report_key, run_dir

    rendered = render(
        [collect(st, r, [s.name for s in rec.stages], gain_targets(rec.stages)) for r, rec in zip(run_ids, recipes)]
    )
    if target is None:
        key = html_report_key(run_ids[0]) if len(run_ids) == 1 else f"{run_dir(run_ids[0])}/compare-{run_ids[1]}.html"
        st.write_bytes(key, rendered.html.encode())
        typer.echo(f"html report: {st.uri(key)}")
        return
    try:
        target.write_text(rendered.html)
    except OSError as e:
        raise CLIError(f"cannot write {target}: {e.strerror or e}") from None
    typer.echo(f"html report: {target.resolve()}")


def _check_writable(path: Path) -> None:
    """Before any work: a path that cannot be written (no such directory, read-only, a directory) is bad input.
    Probed by opening it, so whatever the reason (permissions, a read-only or virtual file system) it shows here."""
    if path.is_dir():
        raise CLIError(f"cannot write {path}: it is a directory")
    if not path.parent.is_dir():
        raise CLIError(f"cannot write {path}: no such directory {path.parent}")
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        raise CLIError(f"cannot write {path}: {e.strerror or e}") from None
    if not existed:
        path.unlink(missing_ok=True)


@app.command("gc")
@guarded
def gc_cmd(
    run_ids: list[str] | None = typer.Argument(None, help="Runs to clean (default: every run in the store)."),
    keep: int = typer.Option(2, "--keep", help="Committed step checkpoints kept per stage."),
    delete: bool = typer.Option(False, "--yes", help="Delete; without it, only show the plan."),
    store: str | None = typer.Option(None, "--store"),
    local: bool = typer.Option(
        False, "--local", help="Instead: the scratch directories in $TMPDIR no live process owns (left by a kill -9)."
    ),
) -> None:
    """List (then with --yes delete) orphaned partial uploads and step checkpoints beyond the last K per stage."""
    from cascade.artifacts.gc import gc
    from cascade.artifacts.scratch import gc_local

    if local:
        if run_ids or store is not None:
            raise CLIError("gc --local cleans this machine's temp directory: it takes no run ids and no --store")
        typer.echo(gc_local(delete).render())
        return
    if keep < 1:
        raise CLIError(f"--keep must be >= 1, got {keep}")
    st = store_for(store)
    for r in run_ids or []:
        stored_recipe(st, r)
    typer.echo(gc(st, run_ids or None, keep_last=keep, delete=delete).render())
