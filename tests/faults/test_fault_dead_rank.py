"""kill -9 of one torchrun rank while `cascade run` trains a 2-rank SFT stage, then `cascade resume`.

One trial: `python -m cascade.flows.cli run kill.yaml` with `stages.sft.compute.nproc_per_node=2` on a file store. Once
the SFT stage has committed a step checkpoint, the test finds rank 1 (a process whose command line runs
`cascade.stages.scale.launch` on a spec dir under this test's TMPDIR and whose environment has RANK=1) and SIGKILLs
it. The CLI must exit 1 with one line naming the stage and the rank; no partial checkpoint may be adopted (every
manifest verifies, the SFT stage has no final manifest); no rank survives; the lease is released; and `cascade resume`
continues the SFT stage from its newest step checkpoint, still on 2 ranks, and finishes the run, whose final
weights load in transformers.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cascade.artifacts.checkpoint import committed
from cascade.artifacts.layout import lease_key, stage_key, steps_dir
from cascade.artifacts.report import RunReport
from cascade.artifacts.steplog import read_rows
from cascade.artifacts.store import Store
from tests.faults.conftest import KILL_RECIPE, QUIET, cascade, manifests, unverified

pytestmark = [pytest.mark.long, pytest.mark.slow]
RUN_ID = "dead-rank"
SFT_STEPS = 6
SFT_KEY = stage_key(RUN_ID, 1, "sft")
FAILURE = "cascade: error: stage sft: rank 1 died (killed by SIGKILL); torchrun log: "


def rank_pids(spec_root: Path, rank: int) -> list[int]:
    """Processes running a `cascade.stages.scale.launch` rank on a spec dir under spec_root, with RANK=rank in their
    environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if (
            b"cascade.stages.scale.launch" in cmdline
            and any(a.startswith(str(spec_root).encode()) for a in cmdline)
            and f"RANK={rank}".encode() in environ
        ):
            found.append(int(entry.name))
    return found


def newest_step(store: Store) -> int | None:
    steps = [int(s) for s in store.list_dirs(steps_dir(SFT_KEY)) if s.isdigit()]
    done = [s for s in steps if committed(store, f"{steps_dir(SFT_KEY)}/{s}") is not None]
    return max(done, default=None)


def kill_rank_one_mid_stage(proc, store: Store, spec_root: Path, timeout: float = 120) -> int:
    """Wait until rank 1 runs and the stage has committed a step checkpoint (but not its last); SIGKILL rank 1.
    Returns the newest committed step checkpoint at the kill."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        step, pids = newest_step(store), rank_pids(spec_root, 1)
        if step is not None and pids:
            assert step < SFT_STEPS, f"the stage got to step {step} before the kill: no longer mid-stage"
            os.kill(pids[0], signal.SIGKILL)
            return step
        time.sleep(0.05)
    raise AssertionError(f"no rank 1 with a step checkpoint; CLI exit {proc.poll()}: {proc.stdout.read()[-3000:]}")


def test_a_killed_rank_fails_the_stage_in_one_line_and_resume_finishes(prefect_api, tmp_path):
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    root, spec_root = f"file://{tmp_path}/store", tmp_path / "tmp"
    spec_root.mkdir()
    env = dict(
        os.environ, **QUIET, CASCADE_HOME=str(tmp_path / "home"), PREFECT_API_URL=prefect_api, TMPDIR=str(spec_root)
    )  # the torchrun spec dirs land here
    store = Store(root)
    proc = cascade(
        [
            "run",
            str(KILL_RECIPE),
            "--run-id",
            RUN_ID,
            f"storage.root={root}",
            "stages.math_rl.steps=1",
            "stages.sft.compute.nproc_per_node=2",
            f"stages.sft.steps={SFT_STEPS}",
        ],
        env,
    )
    killed_after = kill_rank_one_mid_stage(proc, store, spec_root)
    print(f"{time.time() - t0:.1f}s: killed rank 1 after step {killed_after}")
    out = proc.communicate(timeout=120)[0]

    assert proc.returncode == 1, out[-3000:]
    ours = [line for line in out.splitlines() if line.startswith("cascade: error:")]
    assert len(ours) == 1 and ours[0].startswith(FAILURE), out[-3000:]
    assert rank_pids(spec_root, 0) == [] and rank_pids(spec_root, 1) == []  # torchrun took rank 0 down too
    store.invalidate()
    assert unverified(store, f"runs/{RUN_ID}") == {}
    assert committed(store, SFT_KEY) is None  # the killed stage committed no final checkpoint
    assert f"{steps_dir(SFT_KEY)}/{killed_after}" in manifests(store, f"runs/{RUN_ID}")
    assert not store.exists(lease_key(RUN_ID))  # released by the failing CLI, not left to expire
    assert RunReport.load(store, RUN_ID).status == "FAILED"

    print(f"{time.time() - t0:.1f}s: run failed")
    before = set(spec_root.glob("cascade-torchrun-*"))
    resumed = cascade(["resume", RUN_ID, "--store", root], env)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out[-3000:]
    print(f"{time.time() - t0:.1f}s: resumed")
    store.invalidate()
    assert unverified(store, f"runs/{RUN_ID}") == {}
    report = RunReport.load(store, RUN_ID)
    assert [(s.name, s.status) for s in report.stages[1:]] == [("sft", "completed"), ("math_rl", "completed")]
    (spec_dir,) = set(spec_root.glob("cascade-torchrun-*")) - before  # the resumed SFT ran on 2 ranks again
    events = [json.loads(line) for line in (spec_dir / "events.jsonl").read_text().splitlines()]
    assert events[0]["restore"][0] == killed_after  # ... from the newest step checkpoint, not from scratch
    rows = read_rows(store, f"runs/{RUN_ID}/metrics/01-sft.jsonl")
    assert [r["step"] for r in rows] == list(range(1, SFT_STEPS + 1))
    final = report.stages[-1].checkpoint.removeprefix(f"{root}/")
    model_dir = tmp_path / "store" / final / "model"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        assert torch.equal(loaded[name], tensor), name
