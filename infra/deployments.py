"""The deployments `cascade deploy` registers and serves; `infra/prefect.yaml` declares the same for
`prefect deploy` (tests/flows/test_deploy.py checks the two agree).

Adding a deployment is one `DeploymentSpec` line here plus its entry in prefect.yaml.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    flow: str  # "package.module:flow_function", importable from the project root
    description: str
    cron: str | None = None  # a schedule, e.g. "0 2 * * *"; None: runs start from the UI, API or an automation
    timezone: str = "UTC"  # of the cron schedule
    parameters: dict[str, Any] = field(default_factory=dict)  # defaults that differ from the flow's own
    tags: tuple[str, ...] = ()
    # its schedule starts paused while the store holds no finished run (what it evaluates by default)
    needs_finished_run: bool = False

    @property
    def entrypoint(self) -> str:
        """The file-path entrypoint prefect.yaml uses: flows/cascade.py:cascade_from_form."""
        module, function = self.flow.split(":")
        return f"{module.removeprefix('cascade.').replace('.', '/')}.py:{function}"

    def load_flow(self) -> Any:
        module, function = self.flow.split(":")
        return getattr(importlib.import_module(module), function)


DEPLOYMENTS: list[DeploymentSpec] = [
    DeploymentSpec(
        "cascade",
        "cascade.flows.cascade:cascade_from_form",
        "Run a recipe end to end from a typed form; with a run_id, continue that run.",
        tags=("cascade", "training"),
    ),
    DeploymentSpec(
        "nightly",
        "cascade.flows.regression_eval:regression_eval_flow",
        "Evaluate checkpoints against a stored per-domain baseline (default: the newest finished run's final "
        "checkpoint, its own recipe); emit cascade.regression.detected and end Failed on a regression.",
        cron="0 3 * * *",
        parameters={"baseline": "nightly"},
        tags=("cascade", "regression-eval"),
        needs_finished_run=True,
    ),
    DeploymentSpec(
        "recover",
        "cascade.flows.recover:recover_flow",
        "MOPD from the baseline's best-per-domain teachers onto a regressed checkpoint, then eval.",
        parameters={"recipe": "tiny", "baseline": "nightly"},
        tags=("cascade", "recover"),
    ),
]
