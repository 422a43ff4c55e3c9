"""Run a training stage's ranks as Ray actors on a Ray cluster (`compute.launcher: ray`).

The ranks are the same as torchrun's (stages/scale/launch.py): each joins one torch.distributed process group (gloo on
CPU, NCCL on CUDA), trains the stage's FSDP2 code and writes the same step checkpoints, manifest last. Only the
placement differs. A placement group holds one bundle per node (`nnodes` bundles of `nproc_per_node` CPUs or
GPUs, STRICT_SPREAD over nodes when there are several), and each bundle holds `nproc_per_node` rank actors with
one CPU or GPU each. Rank 0's actor finds its node's address and a free port, every rank gets them as
MASTER_ADDR/MASTER_PORT (the env:// rendezvous), and rank 0's metric, progress and result events reach this
process through a Ray queue: the lease, the progress bars and MLflow see the stage as if it ran here.

The Prefect flow stays where it runs; only the stage's ranks go to the cluster at `compute.ray_address`, else
RAY_ADDRESS, else a Ray instance started on this host. The spec (recipe, stage config, inputs) travels pickled
through Ray's object store, so the nodes need the same code and the store's URI, not a shared file system.

A rank that fails (an exception, its process killed, its node gone) fails the stage with one line that names the
rank, its node and why; every other rank is killed, the placement group removed, and nothing is committed but
the step checkpoints rank 0 finished (their manifests are written last), so `cascade resume` continues from the
newest one, on any number of ranks (DCP train state reshards on load).
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from typing import Any

from cascade.artifacts.ports import free_port
from cascade.stages.errors import DistributedStageError
from cascade.stages.kinds import StageInputs
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.scale.rank_events import (
    EventSink,
    NullSink,
    error_line,
    forward_event,
    rank_spec,
    run_rank,
)
from cascade.stages.train.context import StageContext, StageResult

POLL_S = 0.2
# a cluster without room for the ranks fails the stage instead of waiting for ever; long enough for an autoscaler
# (KubeRay's worker group scales from 0) to bring GPU nodes up
PLACEMENT_TIMEOUT_S = 600.0
GRACE_S = 3.0  # after the first failure, how long to wait for a dead peer's report (the root cause) to arrive
log = logging.getLogger(__name__)


class QueueSink(EventSink):
    """Rank 0's events as dicts on a Ray queue (EventSink writes them as JSON lines to a file)."""

    def __init__(self, queue: Any):
        self.queue = queue

    def _write(self, event: dict[str, Any]) -> None:
        self.queue.put(event)


class RankActor:
    """One rank of the stage, in its own Ray worker process."""

    def where(self) -> dict[str, Any]:
        """The node's address as the cluster knows it (its `--node-ip-address`), its id, and this process."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)
        return {"ip": ip, "node": node, "pid": os.getpid()}

    def free_port(self) -> int:
        return free_port("")

    def run(
        self, spec_bytes: bytes, rank: int, local_rank: int, world_size: int, master: tuple[str, int], queue: Any
    ) -> None:
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
                "CASCADE_LAUNCHER": "ray",
            }
        )
        run_rank(pickle.loads(spec_bytes), rank, QueueSink(queue) if rank == 0 else NullSink())


def run_ray(cfg: Any, ctx: StageContext, inputs: StageInputs, compute: ComputeConfig) -> StageResult:
    """The stage's ranks as Ray actors; their events go to ctx.log and ctx.progress while they run."""
    import ray
    from ray.util.queue import Queue

    from cascade.stages.scale.host import ray_address, refuse_silent_address

    address = ray_address(compute)
    if not ray.is_initialized():
        if address:
            refuse_silent_address(address)  # a cluster gone since the run began
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    # device auto: a rank of a cluster with GPUs trains on one (a CPU-only bundle would hide them from it)
    gpu = compute.device == "cuda" or (compute.device == "auto" and ray.cluster_resources().get("GPU", 0) >= 1)
    device = "GPU" if gpu else "CPU"
    group = _placement(cfg.name, compute, device)
    queue = Queue(actor_options={"num_cpus": 0})  # schedulable while the ranks hold every CPU
    ranks: list[Any] = []
    try:
        ranks = _start_ranks(group, compute, device)
        places = ray.get([r.where.remote() for r in ranks])
        log.info(
            "stage %s placed: %s",
            cfg.name,
            ", ".join(f"rank {i} on node {p['ip']} ({p['node'][:8]})" for i, p in enumerate(places)),
        )
        master = (places[0]["ip"], ray.get(ranks[0].free_port.remote()))
        spec = pickle.dumps(rank_spec(cfg, ctx, inputs))
        runs = {
            r.run.remote(spec, i, i % compute.nproc_per_node, len(ranks), master, queue): i for i, r in enumerate(ranks)
        }
        return _follow(cfg.name, runs, places, queue, ctx)
    finally:
        for r in ranks:
            ray.kill(r)
        ray.util.remove_placement_group(group)
        queue.shutdown()


def _placement(stage: str, compute: ComputeConfig, device: str) -> Any:
    """A placement group of one bundle per node, ready, or a one-line failure naming what did not fit."""
    import ray
    from ray.util.placement_group import placement_group

    strategy = "STRICT_SPREAD" if compute.nnodes > 1 else "PACK"
    group = placement_group([{device: compute.nproc_per_node}] * compute.nnodes, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(group)
        free = ray.available_resources().get(device, 0)
        raise DistributedStageError(
            f"stage {stage}: the Ray cluster has no room for {compute.nnodes} node(s) x {compute.nproc_per_node} "
            f"{device} rank(s) ({strategy}) after {PLACEMENT_TIMEOUT_S:.0f} s; {free:g} {device} free"
        )
    return group


def _start_ranks(group: Any, compute: ComputeConfig, device: str) -> list[Any]:
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    one = {"num_gpus": 1, "num_cpus": 0} if device == "GPU" else {"num_cpus": 1}
    actor = ray.remote(max_restarts=0)(RankActor)
    return [
        actor.options(**one, scheduling_strategy=PlacementGroupSchedulingStrategy(group, node)).remote()
        for node in range(compute.nnodes)
        for _ in range(compute.nproc_per_node)
    ]


def _follow(
    stage: str, runs: dict[Any, int], places: list[dict[str, Any]], queue: Any, ctx: StageContext
) -> StageResult:
    """Forward rank 0's events until every rank returns; on the first failure, the one line of its root cause."""
    import ray

    result, pending, failures = None, list(runs), []
    while pending:
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        failures += _failures(done, runs)
        for event in queue.get_nowait_batch(queue.qsize()):
            result = forward_event(ctx, event) or result
        if failures:
            deadline = time.monotonic() + GRACE_S  # a killed peer's death is reported after its survivor's error
            while pending and time.monotonic() < deadline and not any(_died(e) for _, e in failures):
                done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
                failures += _failures(done, runs)
            raise DistributedStageError(failure_line(stage, failures, places))
    if result is None:
        raise DistributedStageError(f"stage {stage}: rank 0 returned no result")
    return result


def _failures(done: list[Any], runs: dict[Any, int]) -> list[tuple[int, Exception]]:
    """(rank, error) of each finished rank that failed."""
    import ray

    failed = []
    for ref in done:
        try:
            ray.get(ref)
        except Exception as e:  # noqa: BLE001 - any failure of a rank is the stage's, reported in one line
            failed.append((runs[ref], e))
    return failed


def _died(error: Exception) -> bool:
    from ray.exceptions import ActorDiedError, NodeDiedError

    return isinstance(error, (ActorDiedError, NodeDiedError))


def failure_line(stage: str, failures: list[tuple[int, Exception]], places: list[dict[str, Any]]) -> str:
    """One line: a rank whose process or node died is the root cause; else the first rank's own error."""
    rank, error = next(((r, e) for r, e in failures if _died(e)), failures[0])
    place = places[rank]
    where = f"rank {rank} on node {place['ip']} ({place['node'][:8]}, pid {place['pid']})"
    if _died(error):
        return f"stage {stage}: {where} died: its worker process or node is gone"
    return f"stage {stage}: {where} failed: {error_line(getattr(error, 'cause', None) or error)}"
