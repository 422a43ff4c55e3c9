"""What this host cannot run or reach, refused before a run starts (a recipe validates anywhere: a plan made on a
laptop may be for a cluster, so these checks are not part of the recipe's validation)."""

from __future__ import annotations

import os
import socket

from cascade.stages.kinds import kind_of
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.recipe.schema import Recipe, RecipeError


def check_host(recipe: Recipe) -> None:
    """A stage that puts more torchrun ranks on this host's CPU than it has cores (each rank is a process that
    trains on its own core at least), a Ray address where nothing answers, and a managed vLLM server (engine.kind
    or eval.engine vllm, no engine.url) where the vLLM venv is missing."""
    check_vllm_venv(recipe)
    for address in sorted({ray_address(recipe.compute_for(s)) for s in recipe.stages} - {None}):
        refuse_silent_address(address)
    cores = os.cpu_count() or 1
    gpu = os.path.exists("/dev/nvidiactl")  # what `auto` would find, without importing torch
    for stage in recipe.stages:
        compute = recipe.compute_for(stage)
        on_cpu = compute.device == "cpu" or (compute.device == "auto" and not gpu)
        spread = kind_of(stage.kind).distributable and compute.runs_as == "torchrun"
        if on_cpu and spread and compute.nproc_per_node > cores:
            raise RecipeError(
                f"stage {stage.name!r}: {compute.nproc_per_node} ranks per node on this host's {cores} CPU cores: "
                f"set compute.nproc_per_node to at most {cores}"
            )


def check_vllm_venv(recipe: Recipe) -> None:
    evals = recipe.eval.engine if recipe.eval.enabled else None
    if recipe.engine.url is None and "vllm" in (recipe.engine.kind, evals):
        from cascade.stages.engines.vllm.server import venv_python

        try:
            venv_python()
        except FileNotFoundError as e:
            wants = "engine.kind" if recipe.engine.kind == "vllm" else "eval.engine"
            raise RecipeError(f"{wants} vllm starts a vLLM server, and {e}") from None


def ray_address(compute: ComputeConfig) -> str | None:
    """The Ray cluster a stage's ranks join: compute.ray_address, else RAY_ADDRESS; None: not on Ray, or a Ray
    started on this host."""
    if compute.runs_as != "ray":
        return None
    return compute.ray_address or os.environ.get("RAY_ADDRESS") or None


def refuse_silent_address(address: str, timeout_s: float = 5.0) -> None:
    """A TCP connection to a Ray address (host:port of the GCS, or ray://host:port of the client server) within
    timeout_s, else one line; `ray.init` itself retries for minutes, ignores SIGINT, and prints pages of warnings."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        reason = "no answer in time" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise RecipeError(
            f"Ray address {address}: nothing answers there ({reason}); start the cluster (`ray start --head`) "
            "or fix compute.ray_address / RAY_ADDRESS"
        ) from None
