"""`cascade status | verify | report | gc`: what runs left in the store, read, checked, shown and cleaned up."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from cascade.artifacts.layout import valid_run_id
from cascade.flows.cli.common import (
    CLIError,
    app,
    console,
    guarded,
    store_for,
    stored_recipe,
)


def print_matrix(report, store=None, targets: dict[str, list[str]] | None = None) -> None:
    """The matrix; with the run's store, each cell also gets its standard error (± over the held-out items), and
    each RL stage in `targets` (stage -> the domains it trains) its gains table. Wider than the terminal (a
    recipe with many domains), the matrix's columns go into several tables, never cut."""
    from cascade.artifacts.html_report import item_scores, stage_gains, standard_error
    from cascade.artifacts.score_columns import GREEDY, ScoreColumn

    domains, rows = report.forgetting_matrix()
    if not rows:  # no eval, so no gate decision or gain either
        console.print(f"forgetting matrix ({report.run_id}): no evals yet", highlight=False)
        return
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
        title = f"Forgetting matrix: eval score after each stage ({report.run_id})"
        table = Table(title=title, min_width=len(title))  # a table of few columns would wrap its title
        table.add_column("after stage", no_wrap=True)
        for i in part:
            table.add_column(domains[i], justify="right", no_wrap=True)
        for (stage, _), row in zip(rows, cells):
            table.add_row(stage, *(row[i] for i in part))
        console.print(table)
    if any(ScoreColumn.parse(d).metric == GREEDY for d in domains):
        console.print(
            "each domain: the mean grade of k answers sampled at its RL temperature (the primary metric, "
            "gated); greedy/<domain>: greedy pass@1 beside it; pass@k/<domain>: the share of items with a fully "
            "right answer among the same k"
        )
    for g in report.gate:
        console.print(
            f"gate: {g.domain} fell {g.drop:.3f} after {g.stage} "
            f"(best {g.best:.3f}, tolerance {g.tolerance}): {g.action}"
        )
    gains = stage_gains([stage for stage, _ in rows], items, targets or {})
    if gains:
        console.print(gains_table(gains))


def gains_table(gains) -> Table:
    """Each RL stage's paired gain on its own domains (`html_report.stage_gains`), a row per stage and column."""
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
    return table


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


def stage_positions(store, run_id: str, recipe) -> list[tuple[str, str, int | None]]:
    """Where each stage of a run stands, as a resume takes it up (the stage-execution core decides, in
    stages/execution.py): (name, what a resume does, the step it continues from): committed (skipped), rebuilt and
    why, continuing from its newest step checkpoint, or starting."""
    from cascade.stages.execution import describe, standings

    found = standings(recipe, store, run_id)
    return [(step.stage.name, describe(here, step.stage), here.resumes_from) for step, here in found]


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
                stages = [[s.name, s.status] for s in rep.stages] if rep else []
                state = run_state(st, r, rep)
            except CLIError as e:
                stages, state = [["report", f"unreadable ({e})"]], "unknown"
            summary.append({"run_id": r, "state": state, "stages": stages})
        if as_json:
            typer.echo(json.dumps(summary))
            return
        table = Table("run id", "state", "stages")
        for row in summary:
            stages = ", ".join(f"{n}:{s}" for n, s in row["stages"]) or "(none recorded)"
            table.add_row(row["run_id"], row["state"], stages)
        console.print(table)
        return
    recipe = stored_recipe(st, run_id)
    report = _load_report(st, run_id) or RunReport(run_id=run_id, recipe=recipe.name)
    if as_json:
        typer.echo(report.model_dump_json())
        return
    console.print(run_process(st, run_id, report), highlight=False)
    table = Table("stage", "kind", "status", "seconds", "checkpoint", title=f"run {run_id}")
    resumes_at = {name: step for name, _, step in stage_positions(st, run_id, recipe)}
    for index, cfg in enumerate(recipe.stages):
        s = report.stage(cfg.name)
        status = stage_status(st, run_id, index, cfg.name, s.status if s else "pending")
        if resumes_at[cfg.name] is not None:  # a stage cut off mid-way: where a resume takes it up
            status = f"{status} (step checkpoint {resumes_at[cfg.name]})"
        seconds = "" if s is None or s.seconds is None else str(s.seconds)
        table.add_row(cfg.name, cfg.kind, status, seconds, (s.checkpoint if s else None) or "")
    console.print(table)
    print_matrix(report, st, gain_targets(recipe.stages))


def run_process(store, run_id: str, report) -> str:
    """The run's state as the run listing names it, then whether a process runs it now: its lease's owner, alive or
    gone."""
    from cascade.artifacts.lease import describe, is_live, owner_gone, read_lease

    lease = read_lease(store, run_id)
    state = state_of(lease, report)
    if lease is not None and is_live(lease):
        return f"{state}: {describe(lease)}"
    if lease is not None:
        why = "its process is gone" if owner_gone(lease) else "its lease expired"
        return f"{state}: {why} ({describe(lease)}); `cascade resume {run_id}` continues it"
    if state != "finished":
        return f"{state}; `cascade resume {run_id}` continues it"
    return state


def run_state(store, run_id: str, report) -> str:
    """A run in one word: `running` (a live lease), `finished` or `failed` (how its record's last finish ended),
    else `killed`: its process ended without recording a finish (a kill leaves its lease behind, expired or
    owned by a process that is gone)."""
    from cascade.artifacts.lease import read_lease

    return state_of(read_lease(store, run_id), report)


def state_of(lease, report) -> str:
    """`run_state` from a run's lease (None: none) and record, read once by the caller."""
    from cascade.artifacts.lease import is_live

    if is_live(lease):
        return "running"
    if report is not None and report.status in ("FINISHED", "FAILED"):
        return report.status.lower()
    return "killed"


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
