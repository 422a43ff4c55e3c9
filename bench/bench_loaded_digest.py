"""The same seed gives the same model whatever the host's load: an SFT stage run idle and beside busy processes.

    .venv/bin/python bench/bench_loaded_digest.py [--recipe tiny] [--steps 60] [--hogs 2] [key=value ...]

Runs the recipe's sft_data and sft stages (the stage driver, `python -m cascade.stages.run`, SFT cut to --steps)
twice from an empty store: once on an idle host, once with --hogs processes spinning on the cores. `compute.dtype`
stays as the recipe has it (auto for tiny), so each run decides it as a user's run does, from an empty dtype
cache (a CASCADE_HOME of its own). Prints per run the dtype the stage recorded, the sha256 of its model weights,
the wall seconds and the load average; the claim holds when both rows have the same dtype and digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def spin() -> None:
    while True:
        pass


def run_sft(recipe: str, steps: int, extra: list[str], work: Path) -> dict:
    env = {**os.environ, "CASCADE_HOME": str(work / "home")}
    overrides = [
        f"storage.root=file://{work}/store",
        f"stages.sft.steps={steps}",
        f"stages.sft.warmup_steps={max(1, steps // 10)}",
        "stages.sft.checkpoint_every=0",
        *extra,
    ]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "cascade.stages.run", recipe, *overrides, "--stage", "sft_data", "--stage", "sft"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    sft = next((work / "store" / "runs" / "driver").glob("*-sft"))
    weights = (sft / "model" / "model.safetensors").read_bytes()
    manifest = json.loads((sft / "MANIFEST.json").read_text())
    return {
        "dtype": manifest["metrics"]["dtype"],
        "sha256": hashlib.sha256(weights).hexdigest()[:16],
        "seconds": seconds,
        "load": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="tiny")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    rows = {}
    rows["idle"] = run_sft(args.recipe, args.steps, args.overrides, Path(tempfile.mkdtemp(prefix="digest-idle-")))
    hogs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    try:
        loaded = Path(tempfile.mkdtemp(prefix="digest-loaded-"))
        rows[f"{args.hogs} spinning processes"] = run_sft(args.recipe, args.steps, args.overrides, loaded)
    finally:
        for hog in hogs:
            hog.terminate()
    print(f"{args.recipe}: sft_data + sft ({args.steps} steps), compute.dtype as the recipe has it")
    print("| host | dtype | weights sha256 | seconds | load average (1 min) |")
    print("| --- | --- | --- | ---: | ---: |")
    for name, r in rows.items():
        print(f"| {name} | {r['dtype']} | {r['sha256']} | {r['seconds']:.0f} | {r['load']:.2f} |")
    same = len({(r["dtype"], r["sha256"]) for r in rows.values()}) == 1
    print("same dtype and weights" if same else "DIFFERENT models from one seed")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
