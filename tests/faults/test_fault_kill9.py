"""kill -9 at random points of a cascade, then `cascade resume`: every trial completes, every manifest in the
store verifies by sha256, no partial checkpoint is adopted, and the resumed weights equal a straight run's.

Each trial runs `python -m cascade.flows.cli run kill.yaml` against a moto S3 store and SIGKILLs it at a seeded random
point (the seeds are printed and in every assertion message): even trials after a random delay, odd trials right
after a random upload lands (tests/faults/killer.py), so that some kills surely leave partial uploads. It
records the partial uploads the kill left (gc's orphans), resumes, and checks. Two trials run at a time (2
cores). Two trials by default in the suite, one of each kind, side by side (each is a kill and a resume, tens of
seconds; four trials took two rounds, 90 s of the suite's 15 minutes); the seed is fixed, so more
trials per run would test the same points on every run anyway. CASCADE_KILL_TRIALS changes the count
(`CASCADE_KILL_TRIALS=20 make test-faults` for a soak), CASCADE_KILL_SEED the base seed.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load as load_safetensors

from cascade.artifacts.checkpoint import committed, read_manifest
from cascade.artifacts.gc import plan_gc
from cascade.artifacts.report import RunReport
from cascade.artifacts.store import Store
from tests.faults.conftest import KILL_RECIPE, cascade, cli_env, manifests, new_bucket, unverified

pytestmark = [pytest.mark.long, pytest.mark.slow]
TRIALS = int(os.environ.get("CASCADE_KILL_TRIALS", "2"))
BASE_SEED = int(os.environ.get("CASCADE_KILL_SEED", "20261121"))


def started(proc, run_id: str) -> float:
    """Read output until the CLI says it started the run (recipe stored, flow about to start); return the time."""
    for line in proc.stdout:
        if line.startswith(f"run {run_id}:"):
            proc.output = [line]  # keep draining (a full pipe would block the CLI), and keep it for messages
            threading.Thread(target=lambda: proc.output.extend(proc.stdout), daemon=True).start()
            return time.time()
    raise AssertionError(f"{run_id}: the CLI exited before starting the run")


def working(proc, store: Store, run_id: str) -> float:
    """Wait until the run writes its first object after recipe.json (imports and Prefect start-up are over, the
    stages are running); return the time. The kill window covers the stages' work, not the start-up."""
    while proc.poll() is None and len(store.list(f"runs/{run_id}")) < 2:
        time.sleep(0.1)
    return time.time()


def finish(proc, timeout: float = 600) -> str:
    out = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, out[-4000:]
    return out


def final_weights(store: Store, run_id: str) -> dict[str, torch.Tensor]:
    report = RunReport.load(store, run_id)
    assert report and all(s.status in ("completed", "skipped") for s in report.stages), report
    key = report.stages[-1].checkpoint.split(f"{store.root}/", 1)[1]
    return load_safetensors(store.read_bytes(f"{key}/model/model.safetensors"))


def kill_somewhere(
    index: int, seed: int, root: str, env: dict, window: float, uploads: int, store: Store
) -> tuple[str, bool]:
    """Start the run and SIGKILL it at a random point: (how, whether it had finished before the kill)."""
    rng = random.Random(seed)
    run_id = f"kill-{index}"
    args = ["run", str(KILL_RECIPE), "--run-id", run_id, f"storage.root={root}"]
    if index % 2:
        at = rng.randint(1, uploads)
        proc = cascade(args, dict(env, CASCADE_KILL_AT_UPLOAD=str(at)), module="tests.faults.killer")
        started(proc, run_id)
        proc.wait(timeout=600)
        return f"SIGKILL right after upload {at} of {uploads}", proc.returncode == 0
    delay = rng.uniform(0.0, window)
    proc = cascade(args, env)
    started(proc, run_id)
    t0 = working(proc, store, run_id)
    time.sleep(max(0.0, t0 + delay - time.time()))
    finished = proc.poll() is not None
    with contextlib.suppress(ProcessLookupError):  # the run ended before the kill point: nothing left to kill
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return f"SIGKILL {delay:.2f}s into the stages' work", finished


def trial(index: int, root: str, env: dict, window: float, uploads: int, store: Store, reference: dict) -> str:
    seed, run_id = BASE_SEED + index, f"kill-{index}"
    how, finished_first = kill_somewhere(index, seed, root, env, window, uploads, store)
    store.invalidate()
    partial = [i.key for i in plan_gc(store, [run_id], keep_last=10**6).orphans]
    what = f"trial {index} seed {seed}: {how}; partial uploads left: {partial or 'none'}"
    finish(cascade(["resume", run_id, "--store", root], env))
    store.invalidate()
    bad = unverified(store, f"runs/{run_id}")
    assert not bad, f"{what}; manifests that do not verify: {bad}"
    for key in manifests(store, f"runs/{run_id}"):
        parent = read_manifest(store, key)["parent"]
        if parent:  # what the stage started from was a committed checkpoint, byte for byte the one referenced
            ref = committed(store, parent["key"])
            assert ref is not None and ref.digest == parent["digest"], f"{what}; {key} adopted {parent['key']}"
    for key in partial:  # a partial upload is either rewritten whole or still uncommitted, never adopted as is
        base = key.rsplit("/model", 1)[0] if key.endswith("/model") else key
        assert committed(store, base) is None or not unverified(store, base), f"{what}; {key}"
    # once the flow holds the run lease (artifacts/lease.py), the killed run's lease was taken over (its pid is
    # gone) and the finished resume released it
    assert not store.exists(f"runs/{run_id}/LEASE.json"), f"{what}; the lease was not released"
    weights = final_weights(store, run_id)
    for name, tensor in reference.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6), f"{what}; {name} differs from the straight run"
    return what + (" (the run had already finished)" if finished_first else "")


def test_kill_9_at_random_points_then_resume(s3, prefect_api, tmp_path):
    root = f"s3://{new_bucket(s3.url)}/cascade"
    env = cli_env(tmp_path / "home", s3.url, prefect_api)
    store = Store(root, {"client_kwargs": {"endpoint_url": s3.url}, "use_listings_cache": False})
    straight = cascade(["run", str(KILL_RECIPE), "--run-id", "straight", f"storage.root={root}"], env)
    started(straight, "straight")
    t0 = working(straight, store, "straight")
    assert straight.wait(timeout=600) == 0, "".join(straight.output)[-4000:]
    window = time.time() - t0  # the kill points span the stages' work
    reference = final_weights(store, "straight")
    uploads = len([k for k in store.list("runs/straight") if "/MANIFEST.json" not in k and k.count("/") > 2])
    print(f"straight run: {window:.1f}s of stage work after start-up, {uploads} file uploads; base seed {BASE_SEED}")
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(trial, i, root, env, window, uploads, store, reference) for i in range(TRIALS)]
        for f in futures:
            print(f.result())
