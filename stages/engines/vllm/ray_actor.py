"""The managed vLLM server of a multi-rank stage on Ray: an actor on resources of its own.

Under `compute.launcher: ray` the training ranks hold their placement group's bundles. The rollout server is one
more actor, scheduled on `engine.ray_resources` (CPU, GPU or a custom resource that a node pool advertises) and
outside that placement group, so rollout and training capacity are sized apart. Inside it runs the same
`VLLMEngine` as in one process: it starts the server on the actor's node, listening on the node's address so that
ranks on other nodes reach it, and syncs weights by writing them to that node's own disk. The trainer shares no file
system with it: rank 0 sends the gathered weights through Ray's object store, and the actor loads them into its CPU
replica, writes, reloads and runs the logprob probe there. Rank 0 owns the actor, so Ray ends it (and the actor's
engine finalizer the server) when rank 0 ends or dies.

Deviation from the NeMo-RL / veRL way: the weights travel through the object store and the server's disk, not an
NCCL broadcast into the server's GPUs. Correct across nodes and simple; on large models the transfer, not the
reload, would be the cost (docs/SCALE.md).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from cascade.stages.recipe.sections import EngineConfig

log = logging.getLogger(__name__)
# placement (an autoscaler may first bring a rollout node up) plus the server's own start-up limit
READY_TIMEOUT_S = 900.0


class RolloutServer:
    """The actor's class (wrapped by `ray.remote` in `start_rollout_server`): one managed vLLM server."""

    def __init__(self, cfg: EngineConfig, model_config: Any, tokenizer: Any, weights: dict[str, torch.Tensor]):
        import ray
        from transformers import AutoModelForCausalLM

        from cascade.stages.engines import managed_vllm_engine

        node = ray.get_runtime_context().get_node_id()
        self.place = {"node": node, "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}
        self.replica = AutoModelForCausalLM.from_config(model_config)
        self.replica.load_state_dict(weights)
        self.engine = managed_vllm_engine(cfg, self.replica, tokenizer, host=self.place["ip"])

    def where(self) -> dict[str, Any]:
        """The server's URL and the node, address and pid of the actor that runs it."""
        return {**self.place, "url": self.engine.url}

    def sync(self, weights: dict[str, torch.Tensor]) -> dict[str, float]:
        """Load the gathered weights into the server and check them with the probe; the sync's timings."""
        self.replica.load_state_dict(weights)
        self.engine.sync_weights(self.replica)
        return self.engine.last_sync

    def close(self) -> None:
        self.engine.close()


def start_rollout_server(
    cfg: EngineConfig, model: torch.nn.Module, tokenizer: Any, weights: dict[str, torch.Tensor]
) -> tuple[Any, dict[str, Any]]:
    """The server actor on `cfg.ray_resources`, ready; its handle and `where()`. A cluster that has no room for
    it fails in one line instead of waiting for ever."""
    import ray
    from ray.exceptions import GetTimeoutError

    resources = dict(cfg.ray_resources)
    actor = (
        ray.remote(RolloutServer)
        .options(
            num_cpus=resources.pop("CPU", 0.0),
            num_gpus=resources.pop("GPU", 0.0),
            resources=resources,
        )
        .remote(cfg, model.config, tokenizer, weights)
    )
    try:
        place = ray.get(actor.where.remote(), timeout=READY_TIMEOUT_S)
    except GetTimeoutError:
        ray.kill(actor)
        raise RuntimeError(
            f"the rollout server actor (engine.ray_resources {dict(cfg.ray_resources)}) was not ready "
            f"in {READY_TIMEOUT_S:.0f} s: no node has those resources free, or its server did not "
            "start"
        ) from None
    log.info(
        "rollout server placed: node %s (%s), pid %s, %s", place["ip"], place["node"][:8], place["pid"], place["url"]
    )
    return actor, place
