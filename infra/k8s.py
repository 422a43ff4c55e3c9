"""The Kubernetes job variables a recipe's `compute:` settings need (infra/k8s-gpu-job-template.json).

A flow run is one Kubernetes Job (the Prefect kubernetes worker renders the work pool's base job template with
the deployment's and the run's job variables). Its training stages launch torchrun inside the pod
(stages/scale/launch.py), so the pod must hold as many GPUs as the largest `nproc_per_node` of a stage that trains on a
GPU, and the Job as many pods as the largest `nnodes`. Multi-node stages rendezvous at `compute.rdzv_endpoint`,
whose host is the headless Service of infra/k8s-rdzv-service.yaml (`<service>.<namespace>.svc:<port>`): the
Job labels its pods with that service's name, and the service selects the Job's index-0 pod.

What ran: the template is rendered here (tests/flows/test_k8s_template.py) with Prefect's own templating; no
cluster has run it. Pods of index >= 1 (nnodes > 1) run the same flow command as pod 0: a per-node agent that
runs each stage's torchrun with its node rank is not built (docs/SCALE.md).
"""

from __future__ import annotations

from typing import Any

from cascade.stages.kinds import kind_of
from cascade.stages.recipe.schema import Recipe


class JobVariablesError(ValueError):
    """A recipe's compute settings that one Kubernetes Job cannot hold."""


def job_variables(recipe: Recipe) -> dict[str, Any]:
    """gpus_per_node, nnodes and (multi-node only) rdzv_service for the recipe's stages that may run as torchrun
    jobs (their kind is `distributable`). A stage with `launcher: ray` runs its ranks on the Ray cluster, not in
    the Job's pods, and sizes nothing here."""
    trained = [s for s in [*recipe.stages, recipe.gate.recovery] if kind_of(s.kind).distributable]
    computes = [c for c in map(recipe.compute_for, trained) if c.runs_as != "ray"]
    gpu_ranks = [c.nproc_per_node for c in computes if c.device != "cpu"]
    variables: dict[str, Any] = {
        "gpus_per_node": max(gpu_ranks, default=1),
        "nnodes": max((c.nnodes for c in computes), default=1),
    }
    hosts = {c.rdzv_endpoint.rsplit(":", 1)[0] for c in computes if c.nnodes > 1}
    if len(hosts) > 1:
        raise JobVariablesError(
            f"multi-node stages rendezvous at different hosts {sorted(hosts)}: one Job has one rendezvous service"
        )
    if hosts:
        variables["rdzv_service"] = hosts.pop().split(".", 1)[0]
    return variables
