"""Scheduled regression evals on a Prefect server: the automation between its two deployments.

The deployments are in infra/deployments.py with the rest: `regression-eval/nightly` (the regression-eval flow
on a cron schedule, `0 3 * * *` UTC) and `recover/recover` (MOPD recovery from a baseline's best-per-domain
teachers).
- `ensure_automations()`: the automation "on `cascade.regression.detected`, run `recover/recover`", whose
  parameters are templated from the event: `recipe`, `baseline` and `student` (the regressed checkpoint's URI,
  not its alias, which may have moved by the time the recovery runs). Idempotent: it is found by name and
  updated, so calling it again (every `cascade deploy`) leaves exactly one.

The automation needs the recover deployment to exist: it runs that deployment by id (`cascade deploy` registers
the deployments first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from uuid import UUID

from prefect.automations import AutomationCore, EventTrigger, Posture, RunDeployment

from cascade.tasks.regression_tasks import CHECKPOINT_RESOURCE, REGRESSION_EVENT

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient

REGRESSION_EVAL_DEPLOYMENT = "regression-eval/nightly"
RECOVER_DEPLOYMENT = "recover/recover"
AUTOMATION_NAME = "cascade: recover on regression"
# RunDeployment parameters rendered by the server from the triggering event (single expressions keep types).
RECOVER_PARAMETERS = {
    "recipe": "{{ event.payload.recipe }}",
    "baseline": "{{ event.payload.baseline }}",
    "student": "{{ event.payload.checkpoint_uri }}",
}


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
        actions=[
            RunDeployment(source="selected", deployment_id=recover_deployment_id, parameters=dict(RECOVER_PARAMETERS))
        ],
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
