"""Storage and tracking overhead: checkpoint write/read through the Store vs plain s3fs, and MLflow's share of a
tiny stage's wall time.

    .venv/bin/python bench/bench_storage.py [--mb 96] [--repeats 3] [--tracking-recipe tiny --tracking-steps 60]
    [--skip-tracking]

Storage: a moto S3 server on a free local port (a subprocess, stopped at the end). The checkpoint is shaped like a
real one: model.safetensors (1/3 of --mb), state/trainer.pt (2/3: AdamW keeps two moments), and small config and
tokenizer files. "plain" is s3fs's own recursive put/get of the same directory (concurrent, no verification);
"checkpoint" is write_checkpoint (parallel uploads, sha256 checked after upload, manifest last) and materialize
(parallel downloads, every file sha256-verified). Also the re-read variant of the upload check
(CASCADE_VERIFY_UPLOADS=reread), for servers that keep no checksum. Ratios are plain time / checkpoint time (a
throughput ratio: goal >= 0.8). Medians of --repeats, plain and checkpoint interleaved so that load drift on a
shared machine hits both alike.

Tracking: an SFT stage (default: the tiny recipe's model and batch, cut to 60 steps) run twice per repeat, with a list
sink and with the MLflow sink of a Tracker
(local sqlite, created beforehand: its one-time schema migration is not a per-stage cost). Reports the time spent
in tracking calls on the stage's thread (sink creation, every log call, end_stage's flush and wait) as a share of
the stage's wall time (goal < 2%), the fixed per-stage part and the per-call part separately (to project onto
longer stages), and the A/B wall-time difference (noisier on a busy machine).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cascade.artifacts.checkpoint import materialize, write_checkpoint  # noqa: E402
from cascade.artifacts.store import Store  # noqa: E402
from tests.artifacts.servers import FAKE_KEYS, make_bucket, moto_server  # noqa: E402


def make_checkpoint(path: Path, mb: int) -> int:
    rng = os.urandom
    (path / "model").mkdir(parents=True)
    (path / "state").mkdir()
    (path / "model" / "model.safetensors").write_bytes(rng(mb * 2**20 // 3))
    (path / "state" / "trainer.pt").write_bytes(rng(mb * 2**20 * 2 // 3))
    for name, size in (
        ("config.json", 700),
        ("generation_config.json", 120),
        ("tokenizer.json", 600_000),
        ("tokenizer_config.json", 900),
        ("chat_template.jinja", 1500),
    ):
        (path / "model" / name).write_bytes(rng(size))
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_storage(mb: int, repeats: int, tmp: Path) -> list[tuple[str, float, float]]:  # noqa: C901
    os.environ.update(FAKE_KEYS)
    server = moto_server(tmp).start()
    try:
        make_bucket(server.url, "bench")
        opts = {"client_kwargs": {"endpoint_url": server.url}, "use_listings_cache": False}
        store = Store("s3://bench/root", opts)
        src = tmp / "ckpt"
        nbytes = make_checkpoint(src, mb)
        times: dict[str, list[float]] = {
            k: [] for k in ("plain put", "ckpt write", "ckpt write (re-read check)", "plain get", "ckpt read")
        }
        for i in range(repeats):
            remote = f"{store.path('plain')}/{i}"

            def put():
                times["plain put"].append(timed(lambda: store.fs.put(str(src), remote, recursive=True)))

            def write():
                times["ckpt write"].append(
                    timed(
                        lambda: write_checkpoint(
                            store, f"ckpt/{i}", src, stage="bench", step=i, parent=None, config_hash="b"
                        )
                    )
                )

            for op in (put, write) if i % 2 == 0 else (write, put):  # alternate who goes first
                op()
            os.environ["CASCADE_VERIFY_UPLOADS"] = "reread"
            reread = Store("s3://bench/root", opts)
            times["ckpt write (re-read check)"].append(
                timed(
                    lambda: write_checkpoint(
                        reread, f"reread/{i}", src, stage="bench", step=i, parent=None, config_hash="b"
                    )
                )
            )
            del os.environ["CASCADE_VERIFY_UPLOADS"]
            ref = write_checkpoint(store, f"ckpt/{i}", src, stage="bench", step=i, parent=None, config_hash="b")
            out_plain, out_ckpt = tmp / f"get-{i}", tmp / f"mat-{i}"
            get = lambda: times["plain get"].append(timed(lambda: store.fs.get(remote, str(out_plain), recursive=True)))  # noqa: E731
            read = lambda: times["ckpt read"].append(timed(lambda: materialize(store, ref, out_ckpt)))  # noqa: E731
            for op in (get, read) if i % 2 == 0 else (read, get):
                op()
            shutil.rmtree(out_plain), shutil.rmtree(out_ckpt)
        med = {k: statistics.median(v) for k, v in times.items()}
        mbs = nbytes / 2**20
        rows = [(k, mbs / t, t) for k, t in med.items()]
        rows.append(("ratio write (plain/ckpt)", med["plain put"] / med["ckpt write"], 0.0))
        rows.append(("ratio write, re-read check", med["plain put"] / med["ckpt write (re-read check)"], 0.0))
        rows.append(("ratio read (plain/ckpt)", med["plain get"] / med["ckpt read"], 0.0))
        return rows
    finally:
        server.stop()


class TimedSink:
    """Wraps a sink and adds the time spent in its calls to `spent`."""

    def __init__(self, sink, spent: list[float]):
        self.sink, self.spent = sink, spent

    def log(self, step, metrics):
        start = time.perf_counter()
        self.sink.log(step, metrics)
        self.spent.append(time.perf_counter() - start)

    def restore(self, step, history):
        self.sink.restore(step, history)


def bench_tracking(repeats: int, steps: int, recipe_name: str, tmp: Path) -> list[tuple[str, float]]:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from cascade.artifacts.tracking import Tracker
    from cascade.flows.recipes import load_recipe
    from cascade.stages.kinds import StageInputs
    from cascade.stages.kinds.sft.run_sft import run_sft
    from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
    from cascade.stages.train.context import ListSink, StageContext

    tmp.mkdir(parents=True, exist_ok=True)
    recipe = load_recipe(
        recipe_name,
        [
            f"storage.root=file://{tmp}/store",
            f"tracking.uri=sqlite:///{tmp}/mlflow.db",
            f"stages.sft.steps={steps}",
            f"stages.sft.warmup_steps={min(steps, 10)}",
            "stages.sft.checkpoint_every=0",
        ],
    )
    store = Store.from_config(recipe.storage)
    data = run_sft_data(
        recipe.stage("sft_data"),
        StageContext(recipe, store, "b", "runs/b/00-sft_data", ListSink(), workdir=tmp),
        StageInputs(),
    ).checkpoint
    Tracker(recipe, "warm-up")  # creates the sqlite schema once: not a per-stage cost
    plain, tracked, shares, fixed, per_call = [], [], [], [], []
    for i in range(repeats):
        ctx = StageContext(recipe, store, f"p{i}", f"runs/p{i}/01-sft", ListSink(), workdir=tmp)
        plain.append(timed(lambda: run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))))
        calls: list[float] = []
        start = time.perf_counter()
        tracker = Tracker(recipe, f"t{i}")  # what stage_task does per stage
        sink = tracker.stage_sink("sft")
        opened = time.perf_counter() - start
        ctx = StageContext(recipe, store, f"t{i}", f"runs/t{i}/01-sft", TimedSink(sink, calls), workdir=tmp)
        result = run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
        t0 = time.perf_counter()
        tracker.end_stage(sink, result.metrics, "FINISHED")
        closed = time.perf_counter() - t0
        wall = time.perf_counter() - start
        tracked.append(wall)
        fixed.append(opened + closed)
        per_call.append(statistics.median(calls))
        shares.append((opened + closed + sum(calls)) / wall)
    p, t = statistics.median(plain), statistics.median(tracked)
    return [
        ("stage wall, list sink (s)", p),
        ("stage wall, MLflow sink (s)", t),
        ("fixed per stage: open + end (s)", statistics.median(fixed)),
        ("per metrics call (ms)", statistics.median(per_call) * 1000),
        ("tracking calls / stage wall (%)", statistics.median(shares) * 100),
        ("A/B wall difference (%)", (t - p) / p * 100),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tracking-recipe", default="tiny", help="recipe whose SFT stage is tracked (model, batch)")
    parser.add_argument("--tracking-steps", type=int, default=60, help="SFT steps of the tracked stage")
    parser.add_argument("--skip-tracking", action="store_true")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix=f"bench-storage-{secrets.token_hex(2)}-"))
    try:
        rows = bench_storage(args.mb, args.repeats, tmp / "s3")
        print(f"\nStorage: {args.mb} MB checkpoint (3 large + 5 small files), moto S3, median of {args.repeats}")
        print(f"{'what':34s} {'MB/s or ratio':>14s} {'seconds':>9s}")
        for name, value, secs in rows:
            print(f"{name:34s} {value:14.2f} {secs:9.2f}" if secs else f"{name:34s} {value:14.2f}")
        if not args.skip_tracking:
            rows = bench_tracking(args.repeats, args.tracking_steps, args.tracking_recipe, tmp / "tracking")
            print(
                f"\nTracking: {args.tracking_recipe} recipe's SFT stage cut to {args.tracking_steps} steps, local "
                f"sqlite MLflow, median of {args.repeats}"
            )
            for name, value in rows:
                print(f"{name:34s} {value:10.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
