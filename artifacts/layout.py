"""Every key in the store, built in one place.

```
runs/<run_id>/recipe.json                 the recipe the run executes (written once, under the run's lease)
runs/<run_id>/LEASE.json                  the one-writer lease
runs/<run_id>/report.json                 stages, evals, gate decisions (artifacts/report.py)
runs/<run_id>/report.html                 the rendered run report: matrix, curves, data, gate, cost, links
runs/<run_id>/metrics/<NN>-<stage>.jsonl  a stage's per-step metrics, one row per step (artifacts/steplog.py)
runs/<run_id>/<NN>-<stage>/               a stage's checkpoint: MANIFEST.json last (artifacts/checkpoint.py)
runs/<run_id>/<NN>-<stage>/steps/<step>/  its step checkpoints
runs/<run_id>/<NN>-<stage>/shards/<NNNNN>/  the SFT data build's committed shards
runs/<run_id>/evals/<NN>-<stage>.json     the eval record after a stage (artifacts/records.py: EvalRecord)
runs/<run_id>/verdicts.json               a recover run's verdicts against its baseline
runs/<run_id>/prefect-results/            Prefect's persisted task results (the stage cache)
baselines/<name>.json                     regression-eval baselines
regression/<eval_id>/<checkpoint>.json    a regression eval's records, and verdicts.json
cache/rollouts/<key>/                     the difficulty filter's rollout cache
```

Keys are '/'-separated and relative to the store root; `Store.uri(key)` turns one into a URI.
"""

from __future__ import annotations

import re

RUNS = "runs"
MANIFEST = "MANIFEST.json"
LEASE = "LEASE.json"
ROLLOUT_CACHE = "cache/rollouts"
BASELINE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,80}")
RUN_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,80}$"  # a key segment, and the run form's field pattern


def valid_run_id(run_id: str) -> bool:
    return re.fullmatch(RUN_ID_PATTERN, run_id) is not None  # fullmatch: "$" alone lets "id\n" through


def run_dir(run_id: str) -> str:
    return f"{RUNS}/{run_id}"


def recipe_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/recipe.json"


def run_store_root(uri: str) -> str | None:
    """The root of the store that holds a run, from the URI of the run's recipe.json (`<root>/runs/<id>/recipe.json`):
    where the run is now, which its recipe does not say once the store has moved; None for another file."""
    found = re.fullmatch(rf"(.+)/{RUNS}/([^/]+)/recipe\.json", uri)
    return found.group(1) if found and valid_run_id(found.group(2)) else None


def run_relative_key(uri: str, run_id: str) -> str | None:
    """The key of a URI a run recorded (a checkpoint's) in whichever store holds the run now: its part from
    `runs/<run_id>/` on, so a store that moved since still finds it; None where the URI holds no such part."""
    _, found, rest = uri.rstrip("/").rpartition(f"/{run_dir(run_id)}/")
    return f"{run_dir(run_id)}/{rest}" if found and rest else None


def lease_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/{LEASE}"


def report_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/report.json"


def html_report_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/report.html"


def metrics_dir(run_id: str) -> str:
    return f"{run_dir(run_id)}/metrics"


def metrics_key(run_id: str, index: int, name: str) -> str:
    return f"{metrics_dir(run_id)}/{index:02d}-{name}.jsonl"


def results_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/prefect-results"


def stage_key(run_id: str, index: int, name: str) -> str:
    return f"{run_dir(run_id)}/{index:02d}-{name}"


STAGE_DIR = re.compile(r"\d{2,}-[^/]+")  # the last segment of a stage_key


def steps_dir(stage: str) -> str:
    return f"{stage}/steps"


def step_key(stage: str, step: int) -> str:
    return f"{steps_dir(stage)}/{step}"


def shards_dir(stage: str) -> str:
    return f"{stage}/shards"


def shard_key(stage: str, index: int) -> str:
    return f"{shards_dir(stage)}/{index:05d}"


def evals_dir(run_id: str) -> str:
    return f"{run_dir(run_id)}/evals"


def eval_key(run_id: str, index: int, stage: str) -> str:
    return f"{evals_dir(run_id)}/{index:02d}-{stage}.json"


def verdicts_key(run_id: str) -> str:
    return f"{run_dir(run_id)}/verdicts.json"


def baseline_key(name: str) -> str:
    """Raises ValueError for a name that is not a plain file name."""
    if not BASELINE_NAME.fullmatch(name):
        raise ValueError(f"bad baseline name {name!r}: use lowercase letters, digits, '.', '_' and '-'")
    return f"baselines/{name}.json"


def regression_record_key(eval_id: str, checkpoint_slug: str) -> str:
    return f"regression/{eval_id}/{checkpoint_slug}.json"


def regression_verdicts_key(eval_id: str) -> str:
    return f"regression/{eval_id}/verdicts.json"


def rollout_cache_key(digest: str) -> str:
    return f"{ROLLOUT_CACHE}/{digest}"
