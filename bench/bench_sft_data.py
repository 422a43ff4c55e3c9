"""SFT data build: peak RSS, wall time and row throughput, with and without the MinHash near-duplicate filter.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python bench/bench_sft_data.py [--rows 1000000] [--near-rows 50000]

Each build runs in its own child process (the one the memory test uses: a one-line echo domain, the oracle
teacher, decontamination, exact dedup, token counts, 50,000-row shards committed to a file:// store) and its
peak RSS is read with getrusage(RUSAGE_CHILDREN). The near-duplicate filter's cost per row and its memory are
the difference between the two --near-rows builds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.stages.test_sft_data_memory import build_in_child  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--near-rows", type=int, default=50_000)
    args = parser.parse_args()
    runs = [(args.rows, False), (args.near_rows, False), (args.near_rows, True)]
    print("| source rows | near-dup | peak RSS | wall | rows/s | shards |")
    print("| --- | --- | --- | --- | --- | --- |")
    results = {}
    for rows, near in runs:
        with tempfile.TemporaryDirectory() as work:
            metrics, peak_mb = build_in_child(rows, near, Path(work))
        results[(rows, near)] = (metrics, peak_mb)
        print(
            f"| {rows:,} | {'on' if near else 'off'} | {peak_mb:,.0f} MB | {metrics['wall_s']:.1f} s | "
            f"{metrics['rows_per_s']:,.0f} | {metrics['shards']} |",
            flush=True,
        )
    (off, off_mb), (on, on_mb) = results[(args.near_rows, False)], results[(args.near_rows, True)]
    per_row_ms = (on["wall_s"] - off["wall_s"]) / args.near_rows * 1e3
    per_row_kb = (on_mb - off_mb) * 1024 / args.near_rows
    print(f"\nMinHash LSH near-dup filter: +{per_row_ms:.3f} ms and +{per_row_kb:.2f} KB of peak RSS per row")


if __name__ == "__main__":
    main()
