"""`compute.dtype: auto` made concrete: bf16 (autocast) or fp32 on this host, measured once and cached.

On CUDA, auto is bf16 where the GPU supports it. On a CPU no flag predicts the faster one: hosts that both report
avx512_bf16 ran bf16 autocast 1.6x faster than fp32 and at half fp32's speed (docs/LOG.md). So auto times a
forward+backward of a few matmuls of the tiny model's size in both, and keeps bf16 only when it is at least 10%
faster: below that, fp32's precision is worth more than the time. The decision is cached per host, torch
version and thread count in $CASCADE_HOME/cache/dtype.json; a cache that cannot be read is measured again.

A probe run while other processes held the cores is not cached: there every small matmul of two torch threads
waited ~16 ms for the second core whatever its dtype (1.4 ms on one thread), so both dtypes timed alike and fp32
would have been kept for good on a host where bf16 is twice as fast (docs/LOG.md, 2026-11-26).
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
from typing import Any, Literal

import torch

from cascade.artifacts.home import cascade_home
from cascade.stages.config_base import ComputeConfig

Precision = Literal["bf16", "fp32"]
BF16_MIN_SPEEDUP = 1.10  # bf16's step must take at most 1/1.1 of fp32's
# The probe: PROBE_LAYERS [rows x width] x [width x width] matmuls with a SiLU between, forward and backward.
PROBE_ROWS, PROBE_WIDTH, PROBE_LAYERS = 512, 512, 3
WARMUP_REPS, TIMED_REPS = 1, 5  # a first rep measured within 20% of the later ones: one warm-up is enough
PROBE_BUDGET_S = 0.6  # no timed rep after the first starts later than this: a contended probe ends early
# a probe whose threads spent this share of its time runnable but waiting for a core measured the load
BUSY_WAIT_SHARE = 0.2


def resolve_dtype(compute: ComputeConfig, device: torch.device) -> Precision:
    """The dtype a stage trains in: compute.dtype as set, or what auto picks for this device."""
    if compute.dtype != "auto":
        return compute.dtype
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return cpu_dtype()


def cpu_dtype() -> Precision:
    """This host's cached decision, or a fresh measurement: cached unless other work held the cores meanwhile."""
    identity = host_identity()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_path()
    cache = read_cache(path)
    entry = cache.get(key)
    if isinstance(entry, dict) and entry.get("dtype") in ("bf16", "fp32"):
        return entry["dtype"]
    waited, started = runqueue_wait_s(), time.perf_counter()
    fp32_s, bf16_s = time_probe()
    busy = runqueue_wait_s() - waited > BUSY_WAIT_SHARE * identity["threads"] * (time.perf_counter() - started)
    dtype: Precision = "bf16" if fp32_s >= BF16_MIN_SPEEDUP * bf16_s else "fp32"
    if not busy:
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


def cache_path() -> Path:
    return cascade_home() / "cache" / "dtype.json"


def host_identity() -> dict[str, Any]:
    """What the decision depends on: the machine, its CPU, torch's kernels and how many threads run them."""
    model, flags = cpu_model_and_flags()
    return {
        "host": platform.node(),
        "cpu": model,
        "cpu_flags_hash": hashlib.sha256(flags.encode()).hexdigest()[:16],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def cpu_model_and_flags() -> tuple[str, str]:
    """The first CPU's "model name" and "flags" from /proc/cpuinfo (not its clock, which changes); elsewhere the
    platform's processor name."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields.get("model name", platform.machine()), fields.get("flags", "")


def runqueue_wait_s() -> float:
    """Seconds this process's threads have spent runnable but waiting for a core (Linux schedstat; 0 elsewhere)."""
    waited_ns = 0
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            waited_ns += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended while we read; a kernel without the field
            continue
    return waited_ns / 1e9


def read_cache(path: Path) -> dict[str, Any]:
    """The cached decisions; a missing, unreadable or corrupt file holds none."""
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
    """Seconds of one probe step in fp32 and under bf16 autocast, each the best of its timed reps. The two
    alternate rep by rep, so a change of load hits both. The best, not the median: on a 2-core host shared with
    other work, reps stalled at ~220 ms whatever their dtype against an unstalled 15-30 ms, often enough to hide
    a 2x difference in a median of five (docs/LOG.md, 2026-11-26)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, PROBE_WIDTH, generator=generator)
    weights = [
        (torch.randn(PROBE_WIDTH, PROBE_WIDTH, generator=generator) / PROBE_WIDTH**0.5).requires_grad_()
        for _ in range(PROBE_LAYERS)
    ]

    def step_seconds(bf16: bool) -> float:
        started = time.perf_counter()
        with torch.enable_grad():  # the caller may be under no_grad
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                h = x
                for weight in weights:
                    h = torch.nn.functional.silu(h @ weight)
                loss = h.float().square().mean()
            torch.autograd.grad(loss, weights)
        return time.perf_counter() - started

    best = {False: math.inf, True: math.inf}
    started = time.perf_counter()
    for rep in range(WARMUP_REPS + TIMED_REPS):
        if rep > WARMUP_REPS and time.perf_counter() - started > PROBE_BUDGET_S:
            break
        for bf16 in best:
            seconds = step_seconds(bf16)
            if rep >= WARMUP_REPS:
                best[bf16] = min(best[bf16], seconds)
    return best[False], best[True]
