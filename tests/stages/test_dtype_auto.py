"""compute.dtype auto: explicit settings pass through, a CPU decides by timing bf16 against fp32 (the thread's CPU
time: a busy host decides as an idle one), once per host, and a run stores its decision for every stage and resume."""

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from cascade.artifacts.config import config_hash
from cascade.stages.kinds.sft import SFTConfig
from cascade.stages.recipe.config_base import ComputeConfig, ComputeOverride
from cascade.stages.scale.distributed import process_world
from cascade.stages.train import precision
from cascade.stages.train.precision import cache_path, resolve_dtype

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
def test_auto_on_a_cpu_picks_bf16_only_when_it_is_at_least_10_percent_faster(monkeypatch, fp32_s, bf16_s, expected):
    probe = Probe(fp32_s, bf16_s)
    monkeypatch.setattr(precision, "time_probe", probe)
    world = process_world(ComputeConfig(device="cpu"))
    assert (world.dtype, probe.calls) == (expected, 1)
    assert isinstance(world.autocast(), torch.autocast) == (expected == "bf16")


def test_the_decision_is_cached_per_host_and_torch_version(monkeypatch):
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16"
    [entry] = json.loads(cache_path().read_text()).values()
    assert (entry["dtype"], entry["fp32_ms"], entry["bf16_ms"]) == ("bf16", 2000.0, 1000.0)
    assert entry["torch"] == torch.__version__ and "threads" not in entry  # the probe runs on one thread

    probe.seconds = (1.0, 2.0)  # the cache answers: the probe is not asked again, whatever the thread count
    monkeypatch.setattr(precision.torch, "get_num_threads", lambda: 7)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1

    monkeypatch.setattr(precision.torch, "__version__", "9.9.9")
    assert resolve_dtype(ComputeConfig(), CPU) == "fp32" and probe.calls == 2  # another key: measured again
    assert sorted(e["dtype"] for e in json.loads(cache_path().read_text()).values()) == ["bf16", "fp32"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"x": 1}', b""])
def test_a_corrupt_cache_is_measured_again_and_rewritten(monkeypatch, content):
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1
    cache = json.loads(path.read_text())
    assert [e["dtype"] for e in cache.values() if isinstance(e, dict)] == ["bf16"]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_a_corrupt_entry_for_this_host_is_measured_again(monkeypatch):
    probe = Probe(1.0, 2.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    resolve_dtype(ComputeConfig(), CPU)
    path = cache_path()
    path.write_text(json.dumps({key: {"dtype": "fp16"} for key in json.loads(path.read_text())}))
    assert resolve_dtype(ComputeConfig(), CPU) == "fp32" and probe.calls == 2
    assert [e["dtype"] for e in json.loads(path.read_text()).values()] == ["fp32"]


@pytest.mark.serial  # spins both cores
def test_a_busy_host_decides_as_an_idle_one():
    """The real probe, alone and then with a spinning process on every core: the thread's CPU time leaves the
    load out, so both dtypes measure as they do idle (each within a factor of 2) and the decision is the same."""
    idle = precision.time_probe()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        time.sleep(0.3)  # every spinner is running
        busy = precision.time_probe()
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    decide = lambda fp32_s, bf16_s: fp32_s >= precision.BF16_MIN_SPEEDUP * bf16_s  # noqa: E731
    assert decide(*busy) == decide(*idle), (idle, busy)
    assert all(0.5 < b / i < 2.0 for b, i in zip(busy, idle)), (idle, busy)


@pytest.mark.serial
def test_the_real_probe_is_quick_and_decides(capsys):
    started = time.perf_counter()
    fp32_s, bf16_s = precision.time_probe()
    elapsed = time.perf_counter() - started
    assert elapsed < 4.0, f"the probe took {elapsed:.2f} s"
    assert 0 < fp32_s < elapsed and 0 < bf16_s < elapsed
    assert resolve_dtype(ComputeConfig(), CPU) in ("bf16", "fp32")
    with capsys.disabled():
        print(f"\nprobe here: fp32 {fp32_s * 1e3:.1f} ms, bf16 {bf16_s * 1e3:.1f} ms in {elapsed:.2f} s")


def test_a_run_pins_auto_to_this_hosts_decision_where_every_stage_trains_here(monkeypatch, tmp_path):
    from tests.conftest import micro_recipe

    monkeypatch.setattr(precision, "time_probe", Probe(2.0, 1.0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = micro_recipe(tmp_path, "compute.dtype=auto")  # micro itself trains in fp32
    assert precision.pin_run_dtype(recipe).compute.dtype == "bf16"
    explicit = micro_recipe(tmp_path, "compute.dtype=fp32")
    assert precision.pin_run_dtype(explicit).compute.dtype == "fp32"
    # a GPU decides by its own flag, where it runs
    on_gpu = micro_recipe(tmp_path, "compute.dtype=auto", "compute.device=cuda")
    assert precision.pin_run_dtype(on_gpu).compute.dtype == "auto"
    one_stage_on_ray = micro_recipe(tmp_path, "compute.dtype=auto", "stages.sft.compute.launcher=ray")
    assert precision.pin_run_dtype(one_stage_on_ray).compute.dtype == "auto"


def test_a_run_stores_the_decided_dtype_and_a_resume_keeps_it_when_the_host_decides_otherwise(
    monkeypatch, tmp_path, prefect_harness
):
    from prefect import flow

    from cascade.artifacts.store import Store
    from cascade.tasks.lifecycle import adopt_recipe
    from tests.conftest import micro_recipe

    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    recipe = micro_recipe(tmp_path, "compute.dtype=auto")
    store = Store.from_config(recipe.storage)

    @flow
    def adopt():
        return adopt_recipe(store, "r", recipe).compute.dtype

    assert adopt() == "bf16"
    cache_path().unlink()  # the host now measures fp32 faster: a new run here would train in fp32
    probe.seconds = (1.0, 2.0)
    assert resolve_dtype(ComputeConfig(), CPU) == "fp32"
    assert adopt() == "bf16"  # the resumed run keeps the dtype it started in


@pytest.mark.timeout(30)
def test_a_cache_that_is_not_a_regular_file_is_measured_again_without_waiting_on_it(monkeypatch):
    path = cache_path()
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # read as a file, a FIFO waits for a writer forever
    probe = Probe(2.0, 1.0)
    monkeypatch.setattr(precision, "time_probe", probe)
    assert resolve_dtype(ComputeConfig(), CPU) == "bf16" and probe.calls == 1
    assert path.is_file()  # replaced by the written cache
