"""Store garbage collection: orphaned partial uploads, and step checkpoints beyond the last K per stage.

Orphans are also a cut-off data build's shards without a valid manifest (its committed shards stay: each is its
own commit) and the temporary files of atomic writes cut off before their rename, wherever they are.

A checkpoint directory without a manifest that verifies (present, valid JSON, every listed file present with its
size) is an orphan: a writer died mid-upload, and nothing will ever adopt it. Committed step checkpoints
(`<stage>/steps/<n>/`) are pruned to the newest `keep_last` per stage; the stage's own checkpoint, the run's
recipe, report, evals and lease are never touched. Runs whose lease is live are skipped entirely: their
"orphans" may be uploads in progress.

`plan_gc` only looks; `gc(..., delete=True)` deletes what the plan lists. The CLI prints `GCPlan.render()`.

Verification here is by size (as `committed`), not sha256, so a same-size corrupted step counts as valid and is
kept: that is why `keep_last` defaults to 2, which leaves resume a fallback (stages.train.context falls back to the
previous step when the newest fails its sha256).

Remaining race: a run that acquires its lease after gc checked it and before gc deleted could lose a step
directory it is uploading into. gc re-reads the lease just before deleting each run's items, which narrows the
window to one run's deletions; run gc when no run of that id is starting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cascade.artifacts.checkpoint import CheckpointError, committed, read_manifest
from cascade.artifacts.layout import MANIFEST, RUNS, run_dir, step_key
from cascade.artifacts.lease import describe, is_live, read_lease
from cascade.artifacts.store import Store

STAGE_DIR = re.compile(r"^\d{2}-.+$")
TEMP_FILE = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]{8}$")  # artifacts/store.py's atomic writes


@dataclass
class GCItem:
    key: str  # a directory, or a single file, relative to the store root
    reason: str
    bytes: int


@dataclass
class GCPlan:
    store: str
    keep_last: int
    orphans: list[GCItem] = field(default_factory=list)
    pruned: list[GCItem] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # committed step checkpoints kept
    skipped: list[str] = field(default_factory=list)  # "run: why", for leased runs
    unreadable: list[str] = field(default_factory=list)  # checkpoints whose manifest does not parse: kept, listed
    deleted: bool = False

    @property
    def items(self) -> list[GCItem]:
        return self.orphans + self.pruned

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    def render(self) -> str:
        """Plain text for the CLI: one line per item, then a summary."""
        verb = "deleted" if self.deleted else "would delete"
        lines = [f"{verb}  {i.key}  ({readable_size(i.bytes)}; {i.reason})" for i in self.items]
        lines += [f"skipped run {s}" for s in self.skipped]
        lines += [
            f"kept  {k}  ({MANIFEST} does not parse: inspect it, or `cascade resume` rebuilds the stage)"
            for k in self.unreadable
        ]
        lines.append(
            f"{self.store}: {len(self.orphans)} orphaned partial upload(s), {len(self.pruned)} old step "
            f"checkpoint(s) beyond the last {self.keep_last} per stage, {readable_size(self.total_bytes)} "
            f"{verb.replace('would delete', 'to free')}; {len(self.kept)} step checkpoint(s) kept"
        )
        if not self.deleted and self.items:
            lines.append("run again with --yes to delete them")
        return "\n".join(lines)


def readable_size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def plan_gc(store: Store, run_ids: list[str] | None = None, keep_last: int = 2) -> GCPlan:
    """What gc would delete in the given runs (default: every run in the store)."""
    if keep_last < 1:
        raise ValueError("keep_last must be >= 1: resume needs the newest step checkpoint")
    plan = GCPlan(store=store.uri(RUNS), keep_last=keep_last)
    for run_id in run_ids if run_ids is not None else store.list_dirs(RUNS):
        lease = read_lease(store, run_id)
        if is_live(lease):
            plan.skipped.append(f"{run_id}: leased by {describe(lease)}")
            continue
        for stage in store.list_dirs(run_dir(run_id)):
            if STAGE_DIR.match(stage):
                _plan_stage(store, f"{run_dir(run_id)}/{stage}", keep_last, plan)
        _plan_temp_files(store, run_id, plan)
    return plan


def _plan_temp_files(store: Store, run_id: str, plan: GCPlan) -> None:
    """The temporary files of atomic writes cut off before their rename (`.<name>.tmp-<pid>-<hex>`), wherever
    they are in the run, committed checkpoints included: no manifest lists them and no reader opens them."""
    planned = [i.key for i in plan.items]
    for path, nbytes in sorted(store.sizes(run_dir(run_id)).items()):
        key = f"{run_dir(run_id)}/{path}"
        if TEMP_FILE.match(path.rsplit("/", 1)[-1]) and not any(key.startswith(p + "/") for p in planned):
            plan.orphans.append(GCItem(key, "temporary file of a write cut off before its rename", nbytes))


def _unreadable_manifest(store: Store, key: str) -> bool:
    """A manifest is there but does not parse: its files may be all there is of a stage; never delete them."""
    try:
        read_manifest(store, key)
    except CheckpointError:
        return True
    return False


def _plan_stage(store: Store, key: str, keep_last: int, plan: GCPlan) -> None:
    sizes = store.sizes(key)
    top = {p: n for p, n in sizes.items() if not p.startswith(("steps/", "shards/"))}
    if _unreadable_manifest(store, key):
        plan.unreadable.append(key)
    elif (top or any(p.startswith("shards/") for p in sizes)) and committed(store, key) is None:
        # The stage's own checkpoint is partial: its files go; its steps/ and its committed shards/ stay (resume
        # needs them), and a shard cut off mid-upload goes.
        for name in sorted({p.split("/", 1)[0] for p in top}):
            nbytes = sum(n for p, n in top.items() if p == name or p.startswith(name + "/"))
            plan.orphans.append(GCItem(f"{key}/{name}", f"stage checkpoint without a valid {MANIFEST}", nbytes))
        _plan_shards(store, key, sizes, plan)
    steps = sorted({int(p.split("/")[1]) for p in sizes if p.startswith("steps/") and p.split("/")[1].isdigit()})
    valid: list[int] = []
    for step in steps:
        nbytes = sum(n for p, n in sizes.items() if p.startswith(f"steps/{step}/"))
        if _unreadable_manifest(store, step_key(key, step)):
            plan.unreadable.append(step_key(key, step))
        elif committed(store, step_key(key, step)) is None:
            plan.orphans.append(GCItem(step_key(key, step), f"step checkpoint without a valid {MANIFEST}", nbytes))
        else:
            valid.append(step)
    for step in valid[:-keep_last]:
        nbytes = sum(n for p, n in sizes.items() if p.startswith(f"steps/{step}/"))
        plan.pruned.append(GCItem(step_key(key, step), f"older than the last {keep_last} step checkpoints", nbytes))
    plan.kept += [step_key(key, s) for s in valid[-keep_last:]]


def _plan_shards(store: Store, key: str, sizes: dict[str, int], plan: GCPlan) -> None:
    """A data build's shards (`shards/<n>/`) of a stage that has not committed: each is its own commit."""
    for shard in sorted({p.split("/")[1] for p in sizes if p.startswith("shards/") and p.count("/") >= 2}):
        shard_key = f"{key}/shards/{shard}"
        nbytes = sum(n for p, n in sizes.items() if p.startswith(f"shards/{shard}/"))
        if _unreadable_manifest(store, shard_key):
            plan.unreadable.append(shard_key)
        elif committed(store, shard_key) is None:
            plan.orphans.append(GCItem(shard_key, f"data shard without a valid {MANIFEST}", nbytes))


def gc(store: Store, run_ids: list[str] | None = None, keep_last: int = 2, delete: bool = False) -> GCPlan:
    """Plan, and with delete=True delete, orphans and old step checkpoints. Returns the plan (`.deleted` set)."""
    plan = plan_gc(store, run_ids, keep_last)
    if not delete:
        return plan
    done: list[GCItem] = []
    for run_id in sorted({i.key.split("/")[1] for i in plan.items}):
        lease = read_lease(store, run_id)
        if is_live(lease):  # a run started since we planned: leave it alone
            plan.skipped.append(f"{run_id}: leased by {describe(lease)} (since the plan)")
            continue
        for item in [i for i in plan.items if i.key.split("/")[1] == run_id]:
            # A step dir loses its manifest first, so a crash mid-delete leaves an orphan, never a torn commit.
            store.delete(f"{item.key}/{MANIFEST}")
            store.delete(item.key)
            done.append(item)
    plan.orphans = [i for i in plan.orphans if i in done]
    plan.pruned = [i for i in plan.pruned if i in done]
    plan.deleted = True
    return plan
