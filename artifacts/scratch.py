"""Scratch directories in the temp directory (`cascade-*`), and which of them no live process owns.

A stage's scratch directory holds its model copies, and a torchrun job's holds its log; both are made here. A
kill -9 skips their removal. Ownership is a lock, not a pid that could be reused: the process that makes a
directory holds an flock on its OWNER file while it uses it, and the kernel drops the lock when the process
dies, however it dies. The OWNER file appears already locked (locked under another name, then renamed), so a
directory that has one and whose lock can be taken is owned by nobody. `cascade gc --local` removes such
directories while it holds their lock. A directory without an OWNER file (made by an older cascade, another
tool, or in the instant before its owner locks it) is kept and listed: nothing says whether it is in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cascade.artifacts.gc import readable_size
from cascade.artifacts.user_files import open_regular

PREFIX = "cascade-"
OWNER = ".cascade-owner"  # holds the owner's pid, for the listing; the lock on it is what counts


@contextlib.contextmanager
def owned_tempdir(prefix: str = PREFIX, remove: bool = True) -> Iterator[Path]:
    """A new directory in the temp directory, owned by this process until the block ends, then removed (unless
    `remove` is False: a log an error line names stays, unowned, for `cascade gc --local`)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    pending = path / f"{OWNER}.{os.getpid()}"
    with open(pending, "w") as owner:
        fcntl.flock(owner, fcntl.LOCK_EX)
        owner.write(f"{os.getpid()}\n")
        owner.flush()
        pending.rename(path / OWNER)
        try:
            yield path
        finally:
            if remove:  # while still locked: a concurrent gc --local leaves it alone
                shutil.rmtree(path, ignore_errors=True)


@dataclass
class LocalPlan:
    tmp: Path
    unowned: list[tuple[Path, int, str]] = field(default_factory=list)  # (directory, bytes, whose it was)
    unknown: list[Path] = field(default_factory=list)  # no OWNER file: kept
    in_use: int = 0
    deleted: bool = False

    def render(self) -> str:
        """Plain text for the CLI: one line per directory, then a summary."""
        verb = "deleted" if self.deleted else "would delete"
        lines = [f"{verb}  {path}  ({readable_size(size)}; {owner})" for path, size, owner in self.unowned]
        lines += [f"kept  {path}  (no {OWNER} file: made by another tool or an older cascade)" for path in self.unknown]
        freed = readable_size(sum(size for _, size, _ in self.unowned))
        lines.append(
            f"{self.tmp}: {len(self.unowned)} scratch dir(s) no live process owns, {freed} "
            f"{'freed' if self.deleted else 'to free'}; {self.in_use} in use"
        )
        if not self.deleted and self.unowned:
            lines.append("run again with --yes to delete them")
        return "\n".join(lines)


def gc_local(delete: bool, tmp: Path | None = None) -> LocalPlan:
    """This user's `cascade-*` directories in the temp directory that no live process owns; deleted with
    `delete`, each while its lock is held, so a directory in use is never touched."""
    plan = LocalPlan(Path(tmp or tempfile.gettempdir()), deleted=delete)
    for path in sorted(plan.tmp.glob(f"{PREFIX}*")):
        if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
            continue
        owner = _open_owner(path / OWNER)
        if owner is None:
            plan.unknown.append(path)
            continue
        with owner:
            try:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                plan.in_use += 1
                continue
            plan.unowned.append((path, _bytes_under(path), f"process {owner.read().strip()} is gone"))
            if delete:
                shutil.rmtree(path, ignore_errors=True)
    return plan


def _open_owner(path: Path):
    """The OWNER file opened for reading, or None where there is none or it is not a regular file: a directory
    or a FIFO (which a plain open would wait on forever) in its place is not an owner, and the directory is kept."""
    try:
        fd, _ = open_regular(path, follow_symlinks=False)
    except OSError:  # missing, a dangling or any other symlink, unreadable
        return None
    return None if fd is None else os.fdopen(fd)


def _bytes_under(path: Path) -> int:
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
