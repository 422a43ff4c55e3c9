"""`cascade deploy`: register the Prefect deployments, serve them, print the UI URL."""

from __future__ import annotations

import os

import typer

from cascade.flows.cli.common import CLIError, app, console, guarded, quiet_services


@app.command()
@guarded
def deploy(
    port: int | None = typer.Option(
        None,
        "--port",
        help="Port of the Prefect server started when no PREFECT_API_URL is configured "
        "(default: the last one's, else 4200, else a free one).",
    ),
    limit: str = typer.Option(
        "",
        "--limit",
        help="Global concurrency limit of training stages (default: "
        "$CASCADE_COMPUTE_LIMIT or `compute`; `gpu` on GPU clusters).",
    ),
    serve: bool = typer.Option(
        True,
        "--serve/--no-serve",
        help="Serve the deployments here (default), or only register them (for a worker or `prefect deploy` setup).",
    ),
) -> None:
    """Register the deployments (infra/deployments.py) with Prefect and serve them; print the UI URL.

    Without a configured PREFECT_API_URL, starts a local Prefect server (PREFECT_HOME=$CASCADE_HOME/prefect)
    and stops it on exit."""
    from cascade.artifacts.config import cascade_home
    from cascade.infra.deploy import deploy as deploy_all
    from cascade.tasks.stage import compute_limit_name

    if port is not None and not 0 < port < 65536:
        raise CLIError(f"--port must be in 1..65535, got {port}")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")  # flow-run logs in the UI, runner events here
    quiet_services()
    deploy_all(
        cascade_home() / "prefect",
        port,
        limit or compute_limit_name(),
        serve,
        say=lambda line: console.print(line, highlight=False, soft_wrap=True),
    )
