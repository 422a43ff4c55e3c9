"""`cascade deploy`: everything one machine needs to run cascades from the Prefect UI.

1. A Prefect API: the configured one (PREFECT_API_URL or the active profile), else a `prefect server start` on
   127.0.0.1 with PREFECT_HOME=$CASCADE_HOME/prefect (sqlite), owned and stopped by this command.
2. The global concurrency limit training stages take a slot of (tasks.stage.compute_limit_name), one slot,
   and the default MLflow tracking db and experiment.
3. The deployments of infra/deployments.py, then the automations hook: when `infra/automations.py` exists, its
   `ensure_automations()` runs after the deployments are registered (it finds them by name).
4. A `serve` process (this one) that runs their flow runs as subprocesses, until interrupted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cascade.infra.deployments import DEPLOYMENTS, DeploymentSpec
from cascade.infra.prefect_server import configured_api_url, lasting_port, serving, start_server

AUTOMATIONS_HOOK = "cascade.infra.automations:ensure_automations"


@contextlib.contextmanager
def prefect_api(home: Path, port: int | None, say: Callable[[str], None]) -> Iterator[str]:
    """The configured API, or a server started here for the duration (and PREFECT_API_URL pointing at it)."""
    configured = configured_api_url()
    if configured:
        yield configured
        return
    say(f"no PREFECT_API_URL configured: starting a Prefect server (PREFECT_HOME={home})")
    with serving(*start_server(home, port or lasting_port(home), home / "server.log")) as api_url:
        yield api_url


def ensure_compute_limit(name: str, slots: int = 1) -> None:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, slots)


def runner_deployments(specs: list[DeploymentSpec], paused: set[str] = frozenset()) -> list[Any]:
    from prefect.deployments.runner import EntrypointType
    from prefect.schedules import Cron

    return [
        spec.load_flow().to_deployment(
            name=spec.name,
            description=spec.description,
            parameters=spec.parameters or None,
            schedule=Cron(spec.cron, timezone=spec.timezone) if spec.cron else None,
            paused=spec.name in paused,
            tags=list(spec.tags),
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for spec in specs
    ]


def scheduled_defaults(specs: list[DeploymentSpec], say: Callable[[str], None]) -> set[str]:
    """Says what each scheduled deployment evaluates by default; returns those to pause (no finished run yet)."""
    from cascade.artifacts.config import StorageConfig
    from cascade.artifacts.store import Store
    from cascade.stages.evals.regression import newest_finished_run

    waiting = [spec for spec in specs if spec.needs_finished_run]
    if not waiting:
        return set()
    store = Store.from_config(StorageConfig())
    run = newest_finished_run(store)
    for spec in waiting:
        if run is None:
            say(
                f"{spec.name}: paused: {store.uri('')} holds no finished run to evaluate; after `cascade run`, "
                f"run `cascade deploy` again, or resume it in the UI (Deployments > {spec.name}) with its recipe and "
                "checkpoints set"
            )
        else:
            say(
                f"{spec.name} ({spec.cron} {spec.timezone}): evaluates the newest finished run when it fires, now "
                f"{run.run_id} ({run.checkpoint}), against baseline {spec.parameters.get('baseline')!r}"
            )
    return {spec.name for spec in waiting} if run is None else set()


def run_automations_hook(say: Callable[[str], None]) -> None:
    module, function = AUTOMATIONS_HOOK.split(":")
    if importlib.util.find_spec(module) is None:
        return
    getattr(importlib.import_module(module), function)()
    say(f"automations: {AUTOMATIONS_HOOK} applied")


def ui_url(api_url: str) -> str:
    from prefect.settings import PREFECT_UI_URL

    return PREFECT_UI_URL.value() or api_url.removesuffix("/api")


def deploy(home: Path, port: int | None, limit_name: str, serve: bool, say: Callable[[str], None]) -> None:
    from prefect import serve as serve_deployments

    from cascade.artifacts.config import TrackingConfig
    from cascade.artifacts.tracking import open_experiment
    from cascade.tasks.stage import COMPUTE_LIMIT_ENV

    os.environ[COMPUTE_LIMIT_ENV] = limit_name  # the flow runs (subprocesses) take slots of this limit
    with prefect_api(home, port, say) as api_url:
        ensure_compute_limit(limit_name)
        open_experiment(TrackingConfig())  # the default MLflow db and experiment, before concurrent runs race on it
        deployments = runner_deployments(DEPLOYMENTS, scheduled_defaults(DEPLOYMENTS, say))
        for deployment in deployments:
            deployment.apply()
        run_automations_hook(say)
        say(
            f"deployments: {', '.join(d.full_name for d in deployments)}; "
            f"training stages share global concurrency limit {limit_name!r} (1 slot)"
        )
        say(f"Prefect UI: {ui_url(api_url)}")
        # the terminal's `prefect deployment run ...` and other shells reach this server only through it
        say(f"in another shell: export PREFECT_API_URL={api_url}")
        if serve:
            say("serving: flow runs of these deployments execute here until Ctrl-C")
            serve_deployments(*deployments, print_starting_message=False)
