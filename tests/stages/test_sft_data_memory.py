"""The SFT data build streams: its peak memory grows with the source rows by no more than its dedup sets do, so a
1,000,000-row build stays under the memory limit.

Two builds, of N and 4N rows (in shards of N/4 rows, so both hold one shard of the same size at a time), give the
peak RSS and its growth per row; the growth is bounded per row (what grows by design is the exact-dedup set and
the generator's set of seen split keys, ~200 bytes per row together, docs/LOG.md 2026-11-22), and the peak
projected to 1,000,000 rows along that growth stays under the limit. A build that kept its rows (a leak, or a
shard buffer that never empties) grows by kilobytes per row and fails both. The two builds cost a quarter of
the one million-row build this test ran before (bench/bench_sft_data.py still measures 1M rows).

What the run covers: a synthetic source (a one-line echo domain registered in the child), the oracle teacher,
decontamination against the held-out split, exact dedup (its 16-byte-per-row set grows), token counting with
the tiny tokenizer, Parquet shards (4 and 16) each committed with its own manifest, the data card and the stage commit.
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

import pytest

pytestmark = [pytest.mark.long, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
ROWS = 50_000  # N; the second build has 4N
AT_SCALE = 1_000_000  # the build size the memory limit is for
RSS_LIMIT_MB = 1536
GROWTH_LIMIT_B = 400  # bytes of peak RSS per extra row: twice what the dedup sets take

BUILD = """
import json, sys, tempfile, time
from pathlib import Path
from cascade.artifacts.store import Store
from cascade.stages.kinds import StageInputs
from cascade.stages.train.context import ListSink, StageContext
from cascade.stages.domains import register_domain
from cascade.stages.domains.base import Domain, Item
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data


class Echo(Domain):
    name = "echo"

    def sample(self, rng):
        k = rng.getrandbits(40)
        return Item(self.name, "", f"Repeat {k}.", str(k), {}, split_key=str(k))

    def grade(self, item, completion):
        return float(completion.strip() == item.reference)


register_domain(Echo())
rows, near, work, shard_rows = int(sys.argv[1]), sys.argv[2] == "near", Path(sys.argv[3]), int(sys.argv[4])
recipe = validate_recipe({"domains": {"echo": {"train_size": rows, "heldout_size": 500}},
                          "storage": {"root": f"file://{work}/store"},
                          "stages": [{"kind": "sft_data", "shard_rows": shard_rows, "dedup": {"near": near}}]})
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


def build_in_child(rows: int, near: bool, work: Path, shard_rows: int = 50_000) -> tuple[dict, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, BUILD, str(rows), "near" if near else "exact", str(work), str(shard_rows)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    code, metrics, rss_kb = proc.stdout.strip().splitlines()[-3:]
    assert code == "0", proc.stderr
    return json.loads(metrics), int(rss_kb) / 1024


def test_build_memory_grows_only_by_the_dedup_sets_and_a_million_rows_fit_the_limit(tmp_path):
    peaks = {}
    for rows in (ROWS, 4 * ROWS):
        (work := tmp_path / str(rows)).mkdir()
        metrics, peaks[rows] = build_in_child(rows, near=False, work=work, shard_rows=ROWS // 4)
        assert metrics["input_rows"] == rows and metrics["rows"] == rows  # distinct echo items: nothing dropped
        assert metrics["shards"] == rows // (ROWS // 4) and metrics["dropped/contaminated"] == 0
        assert metrics["tokens"] > 10 * rows
        print(
            f"{rows:,} rows: peak RSS {peaks[rows]:.0f} MB, {metrics['wall_s']:.0f} s, "
            f"{metrics['rows_per_s']:.0f} rows/s"
        )
    growth_b = (peaks[4 * ROWS] - peaks[ROWS]) * 2**20 / (3 * ROWS)
    projected_mb = peaks[4 * ROWS] + max(growth_b, 0) * (AT_SCALE - 4 * ROWS) / 2**20
    print(f"growth {growth_b:.0f} B/row; {AT_SCALE:,} rows projected: {projected_mb:.0f} MB")
    assert growth_b < GROWTH_LIMIT_B, f"peak RSS {peaks}: {growth_b:.0f} bytes per extra row"
    assert projected_mb < RSS_LIMIT_MB, f"peak RSS {peaks}: {projected_mb:.0f} MB projected at {AT_SCALE:,} rows"
