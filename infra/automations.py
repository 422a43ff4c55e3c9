"""Scheduled regression evals on a Prefect server: two deployments and the automation between them.

- `regression_eval_deployment()`: `regression-eval/nightly`, the regression-eval flow on a cron schedule
  (default `0 3 * * *`, UTC).
- `recover_deployment()`: `recover/recover`, MOPD recovery from the best-per-domain teachers of a baseline.
- `ensure_automations()`: the automation "on `cascade.regression.detected`, run `recover/recover`", whose
  parameters are templated from the event: `recipe`, `baseline` and `student` (the regressed checkpoint's URI,
  not its alias, which may have moved by the time the recovery runs). Idempotent: it is found by name and
  updated, so calling it again (every `cascade deploy`) leaves exactly one.

The deployment functions return `RunnerDeployment`s; registering them (`.apply()`, `serve`, or a work pool) is
the caller's business (`cascade deploy`). The automation needs the recover deployment to exist: it runs that
deployment by id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from prefect.automations import AutomationCore, EventTrigger, Posture, RunDeployment
from prefect.schedules import Cron

from flows.recover import recover_flow
from flows.regression_eval import regression_eval_flow
from tasks.regression import CHECKPOINT_RESOURCE, REGRESSION_EVENT

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.deployments.runner import RunnerDeployment

NIGHTLY = "0 3 * * *"
REGRESSION_EVAL_DEPLOYMENT = "regression-eval/nightly"
RECOVER_DEPLOYMENT = "recover/recover"
AUTOMATION_NAME = "cascade: recover on regression"
# RunDeployment parameters rendered by the server from the triggering event (single expressions keep types).
RECOVER_PARAMETERS = {
    "recipe": "{{ event.payload.recipe }}",
    "baseline": "{{ event.payload.baseline }}",
    "student": "{{ event.payload.checkpoint_uri }}",
}


def regression_eval_deployment(
    recipe: str = "tiny", checkpoints: list[str] | None = None, baseline: str = "nightly",
    cron: str = NIGHTLY, timezone: str = "UTC", update_baseline: bool = False,
) -> RunnerDeployment:
    """The scheduled regression eval; `checkpoints=None` evaluates the recipe's newest final-stage alias."""
    return regression_eval_flow.to_deployment(
        name=REGRESSION_EVAL_DEPLOYMENT.split("/")[1],
        schedule=Cron(cron, timezone=timezone),
        parameters={"recipe": recipe, "checkpoints": checkpoints, "baseline": baseline,
                    "update_baseline": update_baseline},
        description="Evaluate named checkpoints against a stored per-domain baseline; emit "
                    f"{REGRESSION_EVENT} on a regression.",
        tags=["cascade", "regression-eval"],
    )


def recover_deployment(recipe: str = "tiny", baseline: str = "nightly") -> RunnerDeployment:
    """The recovery the automation runs; `student` has no default: the event (or the user) names it."""
    return recover_flow.to_deployment(
        name=RECOVER_DEPLOYMENT.split("/")[1],
        parameters={"recipe": recipe, "baseline": baseline},
        description="MOPD from the baseline's best-per-domain teachers onto a regressed checkpoint, then eval.",
        tags=["cascade", "recover"],
    )


def recover_automation(recover_deployment_id: UUID) -> AutomationCore:
    return AutomationCore(
        name=AUTOMATION_NAME,
        description=f"Run {RECOVER_DEPLOYMENT} for each checkpoint that regression-eval finds regressed.",
        trigger=EventTrigger(
            expect={REGRESSION_EVENT},
            match={"prefect.resource.id": f"{CHECKPOINT_RESOURCE}*"},
            for_each={"prefect.resource.id"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[RunDeployment(source="selected", deployment_id=recover_deployment_id,
                               parameters=dict(RECOVER_PARAMETERS))],
    )


def ensure_automations(client: SyncPrefectClient | None = None) -> list[UUID]:
    """Create or update the recovery automation (the recover deployment must be registered); its id, as a list
    so that more automations can join without changing callers."""
    if client is None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as own:
            return ensure_automations(own)
    deployment = client.read_deployment_by_name(RECOVER_DEPLOYMENT)
    wanted = recover_automation(deployment.id)
    found = client.read_automations_by_name(AUTOMATION_NAME)
    if not found:
        return [client.create_automation(wanted)]
    keep, *extra = found
    client.update_automation(keep.id, wanted)
    for duplicate in extra:  # two deploys racing may each have created one
        client.delete_automation(duplicate.id)
    return [keep.id]
