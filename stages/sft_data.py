"""SFT data build: the oracle teacher answers each domain's train prompts; rows are written chat-formatted.

Nemotron-Cascade builds its SFT set from 100B+ teacher models' responses. On CPU each domain's oracle plays the
teacher: its reference answer is correct by construction, so no rejection sampling is needed here.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from artifacts.checkpoint import write_checkpoint
from stages.context import StageContext, StageResult
from stages.domains import get_domain
from stages.recipe import SFTDataConfig, config_hash

DATA_FILE = "data/train.jsonl"


def run_sft_data(cfg: SFTDataConfig, ctx: StageContext) -> StageResult:
    started = time.time()
    domains = cfg.domains or list(ctx.recipe.domains)
    rows = []
    for done, name in enumerate(domains, 1):
        spec = ctx.recipe.domains[name]
        for item in get_domain(name).generate("train", spec.train_size, ctx.recipe.seed):
            rows.append({"domain": name, "messages": [
                {"role": "user", "content": item.prompt},
                {"role": "assistant", "content": item.reference},
            ]})
        ctx.progress(done, len(domains))
    local = Path(tempfile.mkdtemp(dir=ctx.workdir))
    (local / "data").mkdir()
    with open(local / DATA_FILE, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    metrics = {"rows": len(rows), **{f"rows/{d}": n for d, n in Counter(r["domain"] for r in rows).items()}}
    metrics["seconds"] = round(time.time() - started, 2)
    ref = write_checkpoint(ctx.store, ctx.key, local, stage=cfg.name, step=None, parent=None,
                           config_hash=config_hash(cfg), metrics=metrics)
    return StageResult(ref, metrics)
