"""`cascade regression-eval | baseline set | baseline show`: scheduled regression evals against stored baselines."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.table import Table

from cascade.flows.cli.common import CLIError, app, console, flow_logs, guarded, quiet_services

baseline_app = typer.Typer(add_completion=False, help="Stored per-domain baselines of regression evals.")
app.add_typer(baseline_app, name="baseline")


@app.command("regression-eval")
@guarded
def regression_eval_cmd(
    recipe: str | None = typer.Option(
        None,
        "--recipe",
        help="Recipe whose domains, tolerances and store to use (a name, a YAML path or a store URI of a run's "
        "recipe.json). Default: the newest finished run in the store, with its final checkpoint.",
    ),
    checkpoints: list[str] | None = typer.Option(
        None,
        "--checkpoint",
        help="A registry alias models:/<model>@"
        "<alias>, a store URI or a store key; repeatable. Default: "
        "the recipe's newest final-stage alias.",
    ),
    baseline: str = typer.Option("nightly", "--baseline", help="Baseline name (<store>/baselines/<name>.json)."),
    update_baseline: bool = typer.Option(
        False,
        "--update-baseline",
        help="Afterwards, raise each domain's baseline to this run's best score where higher.",
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Evaluate checkpoints against a stored baseline, locally; exit code 1 when any domain regressed."""
    from cascade.artifacts.home import cascade_home
    from cascade.flows.recipes import load_any_recipe
    from cascade.flows.regression_eval import default_checkpoints, regression_eval_flow
    from cascade.infra.prefect_server import LocalAPI
    from cascade.stages.evals.regression import RegressionFound, baseline_key, regressions
    from cascade.tasks.regression_tasks import eval_targets, resolve_checkpoint

    baseline_key(baseline)
    try:
        recipe, checkpoints = eval_targets(recipe, checkpoints)
    except LookupError as e:
        raise CLIError(str(e)) from None
    loaded = load_any_recipe(recipe)
    names = checkpoints or default_checkpoints(loaded)
    for name in names:
        resolve_checkpoint(loaded, name)  # an unknown checkpoint is one line before Prefect starts
    quiet_services()
    log = cascade_home() / "logs" / f"regression-eval-{time.strftime('%Y%m%d-%H%M%S')}.log"
    with LocalAPI(), flow_logs(log):
        state = regression_eval_flow(recipe, names, baseline, update_baseline, return_state=True)
    outcome = state.result(raise_on_failure=False)
    if isinstance(outcome, BaseException) and not isinstance(outcome, RegressionFound):
        raise outcome
    rows = outcome.rows if isinstance(outcome, RegressionFound) else outcome
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        console.print(verdicts_table(rows, baseline))
    if regressions(rows):
        raise typer.Exit(1)


def verdicts_table(rows: list[dict], baseline: str) -> Table:
    """A regression eval's rows (`stages.evals.regression.compare`), scores to 3 decimals as a baseline shows them."""
    table = Table(
        "checkpoint",
        "domain",
        "score",
        "baseline",
        "drop",
        "tolerance",
        "verdict",
        title=f"regression eval against baseline {baseline!r}",
    )
    for r in rows:
        table.add_row(
            r["checkpoint"],
            r["domain"],
            f"{r['score']:.3f}",
            "-" if r["baseline"] is None else f"{r['baseline']:.3f}",
            "-" if r["drop"] is None else f"{r['drop']:+.3f}",
            str(r["tolerance"]),
            r["verdict"],
        )
    return table


@baseline_app.command("set")
@guarded
def baseline_set(
    name: str = typer.Argument(..., help="Baseline name, e.g. nightly."),
    source: str = typer.Argument(
        ...,
        help="An eval record (.json: a store key such as runs/<id>/evals/01-sft.json, "
        "a store URI or a local file) or a checkpoint (alias, URI or store key), "
        "which is evaluated now.",
    ),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose domains and store to use."),
) -> None:
    """Replace a baseline: every domain's score and checkpoint from one eval."""
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe
    from cascade.stages.evals.regression import baseline_key, replace, save_baseline

    loaded = load_recipe(recipe)
    baseline_key(name)
    store = Store.from_config(loaded.storage)
    record = _eval_record(loaded, store, source)
    if not set(record.scores) & set(loaded.tolerances()):  # a regression eval of this recipe would compare nothing
        raise CLIError(
            f"{source} scores none of recipe {loaded.name!r}'s gated columns "
            f"({', '.join(sorted(loaded.tolerances()))}): a baseline from it could never fail"
        )
    save_baseline(store, replace(name, record))
    _print_baseline(store, name)


@baseline_app.command("show")
@guarded
def baseline_show(
    name: str = typer.Argument(...),
    recipe: str = typer.Option("tiny", "--recipe", help="Recipe whose store holds the baseline."),
) -> None:
    """Print a baseline: per domain, the score and the checkpoint that earned it."""
    from cascade.artifacts.store import Store
    from cascade.flows.recipes import load_recipe

    _print_baseline(Store.from_config(load_recipe(recipe).storage), name)


def _eval_record(recipe, store, source: str):
    """The eval record a baseline is set from: read (a .json record) or made now (a checkpoint)."""
    from cascade.artifacts.records import EvalRecord
    from cascade.stages.evals.evaluate import evaluate_model
    from cascade.stages.evals.regression import read_eval_record
    from cascade.tasks.regression_tasks import resolve_checkpoint

    if source.endswith(".json"):
        local = Path(source)
        if "://" not in source and local.is_file():
            return read_eval_record(local.read_bytes(), source)
        key = store.key_of(source) if "://" in source else source
        if key is None or not store.exists(key):
            raise CLIError(f"no eval record {source} (a local file, or a key or URI in {store.uri('')})")
        return read_eval_record(store.read_bytes(key), source)
    ref = resolve_checkpoint(recipe, source)
    scores, _ = evaluate_model(recipe, ref, store)
    return EvalRecord(checkpoint=source, model=ref.uri, digest=ref.digest, scores=scores)


def _print_baseline(store, name: str) -> None:
    from cascade.stages.evals.regression import load_baseline

    baseline = load_baseline(store, name)
    if baseline is None:
        raise CLIError(f"no baseline {name!r} in {store.uri('baselines')}")
    table = Table("domain", "score", "checkpoint", title=f"baseline {name} ({store.uri(f'baselines/{name}.json')})")
    for domain, entry in sorted(baseline.domains.items()):
        table.add_row(domain, f"{entry.score:.3f}", entry.checkpoint)
    console.print(table)
