"""`compute.dtype: auto` made concrete: bf16 (autocast) or fp32 on this host, measured once, cached, and pinned
in the run.

On CUDA, auto is bf16 where the GPU supports it. On a CPU no flag predicts the faster one: hosts that both report
avx512_bf16 ran bf16 autocast 1.6x faster than fp32 and at half fp32's speed, and a host without native bf16 ran
it 3-4x slower (docs/LOG.md). So auto times a forward+backward of a few matmuls of the tiny model's size in both,
and keeps bf16 only when it is at least 10% faster: below that, fp32's precision is worth more than the time.

The probe runs on one thread and counts that thread's CPU time, not the wall clock: other processes on the cores
delay it but do not move what it measures, so a busy host decides as an idle one does (a wall-clock probe on two
threads of a busy host once timed both dtypes alike and kept fp32 where bf16 is twice as fast). The decision is
cached per host and torch version in $CASCADE_HOME/cache/dtype.json; a cache that cannot be read is measured again.
A run decides once: `pin_auto_dtype` writes the decision into the recipe the run stores, so every later stage and
every resume train in the same dtype whatever the host's load or cache.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from cascade.artifacts.home import cascade_home
from cascade.stages.recipe.config_base import ComputeConfig
from cascade.stages.recipe.sections import EngineConfig

if TYPE_CHECKING:
    from cascade.stages.recipe.schema import Recipe

Precision = Literal["bf16", "fp32"]
BF16_MIN_SPEEDUP = 1.10  # bf16's step must take at most 1/1.1 of fp32's
# The probe: PROBE_LAYERS [rows x width] x [width x width] matmuls with a SiLU between, forward and backward.
PROBE_ROWS, PROBE_WIDTH, PROBE_LAYERS = 512, 512, 3
WARMUP_REPS, TIMED_REPS = 1, 5  # a first rep measured within 20% of the later ones: one warm-up is enough
PROBE_BUDGET_S = 2.0  # no timed rep after the second starts later than this (wall clock): a contended probe ends early


def resolve_dtype(compute: ComputeConfig, device: torch.device) -> Precision:
    """The dtype a stage trains in: compute.dtype as set, or what auto picks for this device."""
    if compute.dtype != "auto":
        return compute.dtype
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return cpu_dtype()


def sampling_dtype(engine: EngineConfig, dtype: Precision) -> torch.dtype | None:
    """The dtype the HF engine samples rollouts in where it is not the weights' fp32: bf16 where the recipe asks
    for the training dtype (engine.rollout_dtype: compute) and that dtype (`dtype`) is bf16."""
    if engine.kind == "hf" and engine.rollout_dtype == "compute" and dtype == "bf16":
        return torch.bfloat16
    return None


def cpu_dtype() -> Precision:
    """This host's cached decision, or a fresh measurement, cached."""
    identity = host_identity()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_path()
    cache = read_cache(path)
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("dtype") in ("bf16", "fp32"):
        return entry["dtype"]
    fp32_s, bf16_s = time_probe()
    dtype: Precision = "bf16" if fp32_s >= BF16_MIN_SPEEDUP * bf16_s else "fp32"
    measured = datetime.now(UTC).isoformat(timespec="seconds")
    cache[key] = {
        **identity,
        "dtype": dtype,
        "fp32_ms": round(fp32_s * 1e3, 2),
        "bf16_ms": round(bf16_s * 1e3, 2),
        "measured": measured,
    }
    write_cache(path, cache)
    return dtype


def pin_run_dtype(recipe: Recipe) -> Recipe:
    """The recipe with compute.dtype auto replaced by this host's decision, for a run to store: every stage and
    every resume then train in that dtype. Only where every stage it reaches trains on this host's CPU, in one
    node: a GPU decides by its own flag, and a Ray or multi-node stage on hosts that this one is not."""
    stages = []
    for stage in recipe.stages:
        override = stage.compute_override()
        if override is not None and override.dtype == "auto" and trains_on_this_cpu(override.over(recipe.compute)):
            stage = stage.model_copy(update={"compute": override.model_copy(update={"dtype": cpu_dtype()})})
        stages.append(stage)
    compute = recipe.compute
    if compute.dtype == "auto" and all(trains_on_this_cpu(recipe.compute_for(s)) for s in recipe.stages):
        compute = compute.model_copy(update={"dtype": cpu_dtype()})
    return recipe.model_copy(update={"compute": compute, "stages": stages})


def trains_on_this_cpu(compute: ComputeConfig) -> bool:
    local = compute.runs_as != "ray" and compute.nnodes == 1
    return local and (compute.device == "cpu" or (compute.device == "auto" and not torch.cuda.is_available()))


def cache_path() -> Path:
    return cascade_home() / "cache" / "dtype.json"


def host_identity() -> dict[str, Any]:
    """What the decision depends on: the machine, its CPU and torch's kernels (the probe runs on one thread)."""
    model, flags = cpu_model_and_flags()
    return {
        "host": platform.node(),
        "cpu": model,
        "cpu_flags_hash": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "torch": torch.__version__,
    }


def first_cpu_fields() -> dict[str, str] | None:
    """The first CPU's fields in /proc/cpuinfo ("model name", "flags", "vendor_id", ...); None where it cannot be
    read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_model_and_flags() -> tuple[str, str]:
    """The first CPU's "model name" and "flags" (not its clock, which changes); elsewhere the platform's processor
    name."""
    fields = first_cpu_fields()
    if fields is None:
        return platform.processor() or platform.machine(), ""
    return fields.get("model name", platform.machine()), fields.get("flags", "")


def read_cache(path: Path) -> dict[str, Any]:
    """The cached decisions; a missing, unreadable or corrupt file holds none, and so does anything that is not a
    regular file (reading a FIFO would wait for a writer forever)."""
    if not path.is_file():
        return {}
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):  # ValueError: bad JSON or bytes that are not UTF-8
        return {}
    return cache if isinstance(cache, dict) else {}


def write_cache(path: Path, cache: dict[str, Any]) -> None:
    """Write-then-rename: a process killed mid-write, or two writing at once, never leave a torn file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:  # an unwritable home costs the next stage another probe, not this one its run
        tmp.unlink(missing_ok=True)


def time_probe() -> tuple[float, float]:
    """CPU seconds of one probe step in fp32 and under bf16 autocast, on one torch thread, each the best of its
    timed reps. The thread's CPU time leaves out the time other processes held the core; what remains of the load
    (caches shared with them) hits both dtypes alike, as they alternate rep by rep, and the best rep is the least
    touched by it (docs/LOG.md, 2026-11-26 and 2026-11-28)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, PROBE_WIDTH, generator=generator)
    weights = [
        (torch.randn(PROBE_WIDTH, PROBE_WIDTH, generator=generator) / PROBE_WIDTH**0.5).requires_grad_()
        for _ in range(PROBE_LAYERS)
    ]

    def step_seconds(bf16: bool) -> float:
        started = time.thread_time()
        with torch.enable_grad():  # the caller may be under no_grad
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                h = x
                for weight in weights:
                    h = torch.nn.functional.silu(h @ weight)
                loss = h.float().square().mean()
            torch.autograd.grad(loss, weights)
        return time.thread_time() - started

    best = {False: math.inf, True: math.inf}
    threads, started = torch.get_num_threads(), time.perf_counter()
    torch.set_num_threads(1)  # the work runs on this thread, whose CPU time is what is counted
    try:
        for rep in range(WARMUP_REPS + TIMED_REPS):
            if rep > WARMUP_REPS + 1 and time.perf_counter() - started > PROBE_BUDGET_S:
                break
            for bf16 in best:
                seconds = step_seconds(bf16)
                if rep >= WARMUP_REPS:
                    best[bf16] = min(best[bf16], seconds)
    finally:
        torch.set_num_threads(threads)
    return best[False], best[True]
