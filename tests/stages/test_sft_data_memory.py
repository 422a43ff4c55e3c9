"""The SFT data build streams: 1,000,000 source rows through every stage of the build in bounded memory.

What the run covers: a synthetic source (a one-line echo domain registered in the child), the oracle teacher,
decontamination against the held-out split, exact dedup (its 16-byte-per-row set grows), token counting with
the tiny tokenizer, 20 Parquet shards each committed with its own manifest, the data card and the stage commit.
What it leaves out: the MinHash near-duplicate filter (`dedup.near: false`), whose Python cost (~0.2 ms/row here)
would make this one test take minutes; its LSH index is the one structure that grows with the kept rows, and
bench/bench_sft_data.py measures its memory and speed per row. Peak RSS is read with
getrusage(RUSAGE_CHILDREN) in a wrapper process, so no other child of the test run can inflate it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROWS = 1_000_000
RSS_LIMIT_MB = 1536

BUILD = """
import json, sys, tempfile, time
from pathlib import Path
from cascade.artifacts.store import Store
from cascade.stages.kinds import StageInputs
from cascade.stages.context import ListSink, StageContext
from cascade.stages.domains import register_domain
from cascade.stages.domains.base import Domain, Item
from cascade.stages.recipe import validate_recipe
from cascade.stages.sft_data import run_sft_data


class Echo(Domain):
    name = "echo"

    def sample(self, rng):
        k = rng.getrandbits(40)
        return Item(self.name, "", f"Repeat {k}.", str(k), {}, split_key=str(k))

    def grade(self, item, completion):
        return float(completion.strip() == item.reference)


register_domain(Echo())
rows, near, work = int(sys.argv[1]), sys.argv[2] == "near", Path(sys.argv[3])
recipe = validate_recipe({"domains": {"echo": {"train_size": rows, "heldout_size": 500}},
                          "storage": {"root": f"file://{work}/store"},
                          "stages": [{"kind": "sft_data", "shard_rows": 50_000, "dedup": {"near": near}}]})
ctx = StageContext(recipe, Store.from_config(recipe.storage), "m", "runs/m/00-sft_data", ListSink(), workdir=work)
started = time.time()
result = run_sft_data(recipe.stage("sft_data"), ctx, StageInputs())
print(json.dumps({**result.metrics, "wall_s": time.time() - started}))
"""

# Runs the build as its own child and reports that child's peak RSS (kilobytes on Linux).
WRAPPER = """
import resource, subprocess, sys
out = subprocess.run([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], capture_output=True, text=True)
sys.stderr.write(out.stderr[-3000:])
print(out.returncode)
print(out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}")
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def build_in_child(rows: int, near: bool, work: Path) -> tuple[dict, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", WRAPPER, BUILD, str(rows), "near" if near else "exact", str(work)],
                          capture_output=True, text=True, env=env, timeout=1200)
    code, metrics, rss_kb = proc.stdout.strip().splitlines()[-3:]
    assert code == "0", proc.stderr
    return json.loads(metrics), int(rss_kb) / 1024


def test_million_row_build_stays_under_the_memory_limit(tmp_path):
    metrics, peak_mb = build_in_child(ROWS, near=False, work=tmp_path)
    assert metrics["input_rows"] == ROWS and metrics["rows"] == ROWS  # distinct echo items: nothing dropped
    assert metrics["shards"] == 20 and metrics["dropped/contaminated"] == 0
    assert metrics["tokens"] > 10 * ROWS
    assert peak_mb < RSS_LIMIT_MB, f"peak RSS {peak_mb:.0f} MB"
    print(f"1M rows: peak RSS {peak_mb:.0f} MB, {metrics['wall_s']:.0f} s, {metrics['rows_per_s']:.0f} rows/s")
