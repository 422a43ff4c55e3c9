"""One training process, or N under torchrun: the device, the process group, FSDP2 sharding, DCP train state.

A training stage asks `world_for(compute)` where it runs. Outside torchrun that is one process on the resolved
device with no process group: the in-process path. Under torchrun (any number of ranks, one included:
`compute.launcher: torchrun`) it joins the process group (gloo on CPU, NCCL on CUDA) and the model is sharded
with FSDP2 (`fully_shard` on every decoder
layer, then on the root: embeddings, final norm and head).

Parity with one process is by construction, not by tuning: every loss is already divided by the global token
count (all-reduced over ranks), so the gradient of the global-batch loss is the SUM of the ranks' gradients.
FSDP2 averages by default; a divide factor of 1 with sum-only collectives makes its reduce-scatter a plain sum. FSDP2
forwards are collectives (each layer all-gathers its parameters), so every rank runs the same number of
micro-batches: `rank_micro_batches` pads the short ranks with empty ones.

Step state is saved with torch.distributed.checkpoint (DCP), one file per rank plus a metadata file, from
`get_state_dict` (fully qualified parameter names, whatever the sharding), so it loads into any world size:
2 -> 1 and 1 -> 2 are tested (tests/stages/test_distributed.py).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.train.precision import Precision, resolve_dtype


@dataclass(frozen=True)
class World:
    """This process's place: rank of size, its device, the compute settings it trains with and the dtype it
    trains in."""

    rank: int
    size: int
    device: torch.device
    compute: ComputeConfig
    dtype: Precision  # compute.dtype resolved on this device (never auto): what every reader goes by
    distributed: bool = False  # in a process group (under torchrun, even as its only rank): FSDP2, collectives

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> range:
        """This rank's contiguous share of n items (sizes differ by at most one)."""
        return range(self.rank * n // self.size, (self.rank + 1) * n // self.size)

    def all_sum(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return float(t.item())

    def all_max(self, value: int) -> int:
        if not self.distributed:
            return value
        t = torch.tensor([int(value)], dtype=torch.int64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's obj, in rank order (picklable objects: rollouts, rewards)."""
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def from_main(self, obj: Any) -> Any:
        """Rank 0's obj on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def autocast(self):
        """bf16 autocast on the training device, or nothing for fp32."""
        if self.dtype != "bf16":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("compute.device is cuda but torch sees no GPU")
    return torch.device(device)


def world_for(compute: ComputeConfig) -> World:
    """Where this process trains: as a rank of a launcher it joins the process group first. torchrun sets
    TORCHELASTIC_RUN_ID in every rank; a Ray rank actor (stages/scale/launch_ray.py) sets CASCADE_LAUNCHER=ray."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and os.environ.get("CASCADE_LAUNCHER") != "ray":
        return process_world(compute)
    device = resolve_device(compute.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    # every rank trains in rank 0's dtype: ranks (or nodes) that each measured auto could pick differently
    chosen = [resolve_dtype(compute, device) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(chosen, src=0)
    return World(dist.get_rank(), dist.get_world_size(), device, compute, chosen[0], distributed=True)


def process_world(compute: ComputeConfig) -> World:
    """One process on compute's device, in no process group."""
    device = resolve_device(compute.device)
    return World(0, 1, device, compute, resolve_dtype(compute, device))


def prepare_model(model: torch.nn.Module, world: World) -> torch.nn.Module:
    """The model on the world's device; activation checkpointing if asked; FSDP2-sharded under torchrun."""
    model.to(world.device)
    if world.compute.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not world.distributed:
        return model
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    for sharded in [*layers, model]:  # each shard group reduces its own gradients
        sharded.set_gradient_divide_factor(1.0)  # sum, not mean: losses are normalized by the global count
        sharded.set_force_sum_reduction_for_comms(True)  # a plain SUM collective (gloo has no PREMUL_SUM)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers: the modules of the class HF names in _no_split_modules."""
    layer_classes = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers (its _no_split_modules is empty)")
    return layers


def rank_micro_batches(world: World, n: int, size: int) -> list[slice]:
    """This rank's micro-batches of its n rows, padded with empty ones to the most any rank has: FSDP2
    forwards are collectives, so every rank runs the same count."""
    parts = [slice(i, min(n, i + size)) for i in range(0, n, size)]
    count = world.all_max(len(parts))
    return parts + [slice(n, n)] * (count - len(parts))


def full_state_dict(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor] | None:
    """The whole model's weights on rank 0's CPU (a collective: every rank calls it); None on other ranks.
    In one process: None too, and the caller saves the module itself."""
    if not world.distributed:
        return None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    if not world.is_main:
        return None
    # gathering unties tied weights (the head comes back as a copy of the embedding): keep one name, as HF does
    unique = {name for name, _ in model.named_parameters()}
    tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - unique
    return {name: tensor for name, tensor in state.items() if name not in tied}


def full_weights_everywhere(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank (a collective): what a rank's unsharded rollout copy loads, with
    LoRA merged (a plain model's names and weights)."""
    from cascade.stages.train.lora import merged_state_dict

    return merged_state_dict(model, get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))


def save_train_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Model and optimizer state, sharded as they are: each rank writes its own file into path (a directory
    every rank sees), rank 0 the metadata last."""
    model_state, optim_state = get_state_dict(model, optimizer)
    with one_process_dcp():
        dcp.save(
            {"model": model_state, "optim": optim_state}, checkpoint_id=str(path), no_dist=not dist.is_initialized()
        )


def load_train_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Read what save_train_state wrote, resharded to this world's layout (any world size)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with one_process_dcp():
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


@contextlib.contextmanager
def one_process_dcp() -> Iterator[None]:
    """DCP in one process warns on every call that it assumes one process: that is what we ask of it (no_dist)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield
