"""compute.dtype auto: explicit settings pass through, a CPU decides by timing bf16 against fp32, once per host."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cascade.artifacts.config import config_hash
from cascade.stages import precision
from cascade.stages.config_base import ComputeConfig, ComputeOverride
from cascade.stages.distributed import process_world
from cascade.stages.kinds.sft import SFTConfig
from cascade.stages.precision import cache_path, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class Probe:
    """A stand-in for the timing: returns fixed (fp32, bf16) seconds and counts its calls."""

    def __init__(self, fp32_s: float, bf16_s: float):
        self.seconds, self.calls = (fp32_s, bf16_s), 0

    def __call__(self) -> tuple[float, float]:
        self.calls += 1
        return self.seconds


def never_probe():
    raise AssertionError("the probe ran")


@pytest.fixture
def quiet_host(monkeypatch):
    """No thread waits for a core: a stand-in probe takes microseconds, in which one preemption would read as a
    busy host."""
    monkeypatch.setattr(precision, "runqueue_wait_s", lambda: 0.0)


def test_auto_is_the_default_and_a_stage_override_inherits_it():
    assert ComputeConfig().dtype == "auto"
    assert ComputeOverride().over(ComputeConfig(dtype="fp32")).dtype == "fp32"
    assert ComputeOverride(dtype="bf16").over(ComputeConfig()).dtype == "bf16"


def test_the_dtype_is_not_part_of_a_stages_config_hash():
    hashes = {config_hash(SFTConfig(compute=compute)) for compute in (None, {"dtype": "auto"}, {"dtype": "bf16"})}
    assert len(hashes) == 1


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_an_explicit_dtype_is_used_as_set_without_probing(monkeypatch, dtype):
    monkeypatch.setattr(precision, "time_probe", never_probe)
    assert resolve_dtype(ComputeConfig(dtype=dtype), CPU) == dtype
    assert resolve_dtype(ComputeConfig(dtype=dtype), CUDA) == dtype
    assert process_world(ComputeConfig(device="cpu", dtype=dtype)).dtype == dtype
    assert not cache_path().exists()


@pytest.mark.parametrize("supported, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_on_cuda_asks_the_gpu_and_times_nothing(monkeypatch, supported, expected):
    monkeypatch.setattr(precision, "time_probe", never_probe)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
    assert resolve_dtype(ComputeConfig(), CUDA) == expected
    assert not cache_path().exists()


@pytest.mark.parametrize(
    "fp32_s, bf16_s, expected",
    [
        (2.0, 1.0, "bf16"),  # bf16 twice as fast
        (1.1, 1.0, "bf16"),  # exactly 10% faster
        (1.05, 1.0, "fp32"),  # 5% faster: not worth bf16's rounding
        (1.0, 1.0, "fp32"),
        (1.0, 2.0, "fp32"),  # bf16 twice as slow
    ],
)
def test_auto_on_a_cpu_picks_bf16_only_when_it_is_at_least_10_percent_faster(
    monkeypatch, quiet_host, fp32_s, bf16_s, expected
):
    probe = Probe(fp32_s, bf16_s)
    monkeypatch.setattr(precision, "time_probe", probe)
    world = process_world(ComputeConfig(device="cpu"))
    assert (world.dtype, probe.calls) == (expected, 1)
    assert isinstance(world.autocast(), torch.autocast) == (expected == "bf16")


def test_the_decision_is_cached_per_host_and_thread_count(monkeypatch, quiet_host):
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16"
    [entry] = json.loads(cache_path().read_text()).values()
    assert (entry["dtype"], entry["fp32_ms"], entry["bf16_ms"]) == ("bf16", 2000.0, 1000.0)
    assert entry["threads"] == torch.get_num_threads() and entry["torch"] == torch.__version__

    probe.seconds = (1.0, 2.0)  # the cache answers: the probe is not asked again
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1

    monkeypatch.setattr(precision.torch, "get_num_threads", lambda: entry["threads"] + 1)
    assert resolve_dtype(ComputeConfig(), CPU) == "fp32" and probe.calls == 2  # another key: measured again
    assert sorted(e["dtype"] for e in json.loads(cache_path().read_text()).values()) == ["bf16", "fp32"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"x": 1}', b""])
def test_a_corrupt_cache_is_measured_again_and_rewritten(monkeypatch, quiet_host, content):
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1
    cache = json.loads(path.read_text())
    assert [e["dtype"] for e in cache.values() if isinstance(e, dict)] == ["bf16"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_a_corrupt_entry_for_this_host_is_measured_again(monkeypatch, quiet_host):
    probe = Probe(1.0, 2.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    resolve_dtype(ComputeConfig(), CPU)
    path = cache_path()
    path.write_text(json.dumps({key: {"dtype": "fp16"} for key in json.loads(path.read_text())}))
    assert resolve_dtype(ComputeConfig(), CPU) == "fp32" and probe.calls == 2
    assert [e["dtype"] for e in json.loads(path.read_text()).values()] == ["fp32"]


def test_a_probe_on_a_busy_host_decides_the_stage_but_is_not_cached(monkeypatch):
    waits = iter([10.0, 10.0 + 1.0])  # a second of waiting for a core in a probe of microseconds
    monkeypatch.setattr(precision, "runqueue_wait_s", lambda: next(waits))
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1
    assert not cache_path().exists()


@pytest.mark.serial  # a run-queue wait and a 3 s probe budget: others' load would be counted
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc: the wait reads as 0")
def test_the_runqueue_wait_counts_the_time_a_busy_core_kept_us_waiting():
    """This thread and a spinning child on one core: each runs about half the time, waiting the other half."""
    core = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {core})
    )
    try:
        os.sched_setaffinity(0, {core})
        time.sleep(0.1)  # the child is spinning
        before, started = precision.runqueue_wait_s(), time.perf_counter()
        while time.perf_counter() - started < 0.4:
            pass
        waited = precision.runqueue_wait_s() - before
    finally:
        os.sched_setaffinity(0, mine)
        spinner.kill()
        spinner.wait()
    assert 0.1 < waited < 0.4, waited


@pytest.mark.serial
def test_the_real_probe_is_quick_and_decides(capsys):
    started = time.perf_counter()
    fp32_s, bf16_s = precision.time_probe()
    elapsed = time.perf_counter() - started
    assert elapsed < 3.0, f"the probe took {elapsed:.2f} s"
    assert 0 < fp32_s < elapsed and 0 < bf16_s < elapsed
    assert resolve_dtype(ComputeConfig(), CPU) in ("bf16", "fp32")  # probes again: cached where the host was quiet
    with capsys.disabled():
        print(f"\nprobe here: fp32 {fp32_s * 1e3:.1f} ms, bf16 {bf16_s * 1e3:.1f} ms in {elapsed:.2f} s")
