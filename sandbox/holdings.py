"""What the supervisor holds for a sandboxed run, and lets go of: an unprivileged uid from a pool, readers that keep
a bounded prefix of the program's output, and, at the end, its process group and its working directory.
Standard library only."""

from __future__ import annotations

import os
import shutil
import signal
import threading


class UidPool:
    """Hands out one unprivileged uid per concurrent sandbox.

    Distinct uids give each sandbox its own RLIMIT_NPROC budget (the limit is
    per uid), and keep sandboxes from signalling each other when there is no
    pid namespace.  The random start makes clashes between caller processes
    unlikely (they would only share that budget)."""

    def __init__(self, base: int, size: int = 512):
        self._base, self._size = base, size
        self._start = int.from_bytes(os.urandom(2), "little") % size
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        # A uid that still owns processes (another caller process's sandbox,
        # or zombies stuck under a host init that does not reap) would start
        # with part of its RLIMIT_NPROC budget gone: skip it.
        busy = uids_with_processes()
        with self._lock:
            for i in range(self._size):
                uid = self._base + (self._start + i) % self._size
                if uid not in self._used and uid not in busy:
                    self._used.add(uid)
                    return uid
        raise RuntimeError("sandbox uid pool exhausted")

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


def uids_with_processes() -> set[int]:
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                continue
    return uids


class BoundedReader:
    """Keeps the first ``limit`` bytes of a pipe and drains the rest.

    Draining (instead of stopping) keeps a chatty program from blocking on a
    full pipe, while memory stays bounded whatever it prints."""

    def __init__(self, pipe, limit: int):
        self._pipe, self._limit = pipe, max(0, limit)
        self._buf = bytearray()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                room = self._limit - len(self._buf)
                if room > 0:
                    self._buf += chunk[:room]
        except OSError:
            pass

    def result(self, timeout: float) -> str:
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._pipe.close()
        return bytes(self._buf[: self._limit]).decode("utf-8", errors="replace")


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def remove_tree(path: str) -> None:
    def _unlock_and_retry(func, target, _exc):
        # The program may have chmod-ed its own files to 000.
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=_unlock_and_retry)
