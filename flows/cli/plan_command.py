"""`cascade plan RECIPE`: the dry run. Validates the recipe, draws its DAG, estimates each stage's cost."""

from __future__ import annotations

from pathlib import Path

import typer

from cascade.flows.cli.common import CLIError, app, guarded


@app.command()
@guarded
def plan(
    recipe: str = typer.Argument(..., help="A shipped recipe name (e.g. tiny) or a path to a YAML file."),
    overrides: list[str] | None = typer.Argument(None, help="key=value overrides, e.g. stages.sft.steps=100"),
    on: str = typer.Option(
        "cpu", "--on", help="Throughput profile: cpu (this project's measured 2-core figures), h100 or h200."
    ),
    devices: int = typer.Option(1, "--devices", help="Devices the stages share (e.g. GPUs per node x nodes)."),
    params: float | None = typer.Option(
        None,
        "--params",
        help="Parameter count, for a model that is not on "
        "this machine (default: from the model's config, no weights loaded).",
    ),
    active_params: float | None = typer.Option(
        None, "--active-params", help="Parameters active per token (mixture of experts); default: all of them."
    ),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", help="Assumed prompt length in tokens."),
    image: Path | None = typer.Option(None, "--image", help="Also draw the DAG into this PNG file."),
    as_json: bool = typer.Option(False, "--json", help="Print the estimate as JSON instead of a table."),
) -> None:
    """Dry run: validate the recipe, draw its DAG (stages, evals, the gate's branch), and estimate per stage the
    tokens sampled and trained, the storage and the time, under a stated throughput assumption. Loads no model."""
    from cascade.flows.recipes import load_recipe
    from cascade.infra.k8s import JobVariablesError, job_variables
    from cascade.stages.recipe.plan import dag_lines, draw_dag, make_plan, model_size, plan_json, render_table
    from cascade.stages.recipe.throughput import PROFILES

    if on not in PROFILES:
        raise CLIError(f"--on {on!r}: known profiles are {', '.join(PROFILES)}")
    for name, value in (
        ("--devices", devices),
        ("--prompt-tokens", prompt_tokens),
        ("--params", params),
        ("--active-params", active_params),
    ):
        if value is not None and not value >= 1:
            raise CLIError(f"{name} must be >= 1, got {value:g}")
    if image is not None and not image.parent.is_dir():
        raise CLIError(f"cannot write {image}: no such directory {image.parent}")
    loaded = load_recipe(recipe, overrides or [])
    try:
        k8s = job_variables(loaded)
    except JobVariablesError as e:
        raise CLIError(str(e)) from None
    size = model_size(loaded, params, active_params)
    estimate = make_plan(loaded, size, PROFILES[on], devices, prompt_tokens)
    if as_json:
        typer.echo(plan_json(estimate))
        return
    typer.echo(f"recipe {loaded.name}: valid, {len(loaded.stages)} stages\n")
    typer.echo("\n".join(dag_lines(loaded)) + "\n")
    typer.echo(render_table(estimate))
    typer.echo(
        "\nkubernetes job variables (infra/k8s-gpu-job-template.json): "
        + " ".join(f"--job-variable {k}={v}" for k, v in k8s.items())
    )
    if image is not None:
        draw_dag(loaded, image)
        typer.echo(f"\nDAG image: {image.resolve()}")
