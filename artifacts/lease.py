"""One writer per run: a lease object `runs/<run_id>/LEASE.json` in the store, with an expiry.

The lease names its owner (host, pid, the process's start time, a random token) and an absolute expiry. A
background thread renews it every ttl/3 while the run goes on; `release` deletes it on exit. `acquire` refuses
with `LeaseHeld` (naming the owner and the expiry) while a live lease is held by another owner, and takes over a
lease that has expired, or whose owner process on this same host is gone (a `kill -9`ed run need not wait out
the TTL before `cascade resume`).

Object stores have no compare-and-swap (we do not rely on S3 conditional writes, which not every S3-compatible
server has), so ownership is claimed by write-then-re-read: write our lease, wait `settle` seconds, read it
back, and proceed only if it still carries our token. While held, the lease registers a commit guard with
`artifacts.checkpoint`: before any manifest under `runs/<run_id>/` is written, the lease is re-read, and a
writer that has lost it raises `LeaseLost` instead of committing.

Remaining races, by design bounded rather than closed:
- Two acquirers whose write and re-read interleave within `settle` (A writes, A re-reads, then B writes) can
  both start. The loser finds the other token at its next renewal (<= ttl/3) or commit guard, and stops with
  LeaseLost; until then it may have uploaded files (never a manifest after the guard saw the other token).
- A guard check and the manifest write are two requests: a takeover landing between them lets one stale
  manifest through. Its content is still a complete, verified checkpoint of the same config.
- Expiry compares the owner's clock with the reader's: keep the TTL well above the clock skew between hosts.
- A renewer stalled longer than the TTL (swap, a stopped VM) loses the lease to a takeover; it notices at its
  next renewal or commit and stops.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from cascade.artifacts import checkpoint
from cascade.artifacts.layout import lease_key, run_dir
from cascade.artifacts.store import Store

log = logging.getLogger("cascade.lease")
DEFAULT_TTL = 60.0


class LeaseHeld(RuntimeError):
    """Another live owner holds the run's lease."""


class LeaseLost(RuntimeError):
    """This process held the lease, and another owner has taken it over."""


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux): tells a live pid from a reused one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def read_lease(store: Store, run_id: str) -> dict[str, Any] | None:
    """The lease as stored, or None when there is none (or it is unreadable, which counts as none)."""
    try:
        raw = store.read_bytes(lease_key(run_id))
    except FileNotFoundError:
        return None
    try:
        info = json.loads(raw)
        return info if isinstance(info, dict) and "token" in info and "expires" in info else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def owner_gone(info: dict[str, Any]) -> bool:
    """True when the owner ran on this host and that process no longer exists (or the pid was reused)."""
    if info.get("host") != socket.gethostname() or not info.get("pid"):
        return False
    current = _proc_start(int(info["pid"]))
    if current is None:
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    return info.get("proc_start") is not None and current != info["proc_start"]


def is_live(info: dict[str, Any] | None, now: float | None = None) -> bool:
    return info is not None and (now or time.time()) < float(info["expires"]) and not owner_gone(info)


def describe(info: dict[str, Any], now: float | None = None) -> str:
    left = float(info["expires"]) - (now or time.time())
    expires = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["expires"])))
    return (
        f"host {info.get('host')} pid {info.get('pid')} (token {str(info['token'])[:8]}), lease expires "
        f"{expires} ({f'in {left:.0f}s' if left > 0 else f'{-left:.0f}s ago'})"
    )


class Lease:
    """Usage: `with Lease(store, run_id): run...`. See the module docstring for the protocol and its races."""

    def __init__(self, store: Store, run_id: str, ttl: float = DEFAULT_TTL, settle: float = 0.5):
        self.store, self.run_id, self.ttl, self.settle = store, run_id, ttl, settle
        self.token = secrets.token_hex(16)
        self.lost: str | None = None  # why, once another owner has taken over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self) -> dict[str, Any]:
        now = time.time()
        return {
            "run_id": self.run_id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "proc_start": _proc_start(os.getpid()),
            "token": self.token,
            "acquired": now,
            "expires": now + self.ttl,
        }

    def acquire(self) -> Lease:
        """Take the lease or raise LeaseHeld; then keep renewing it in a background thread."""
        current = read_lease(self.store, self.run_id)
        if is_live(current) and current["token"] != self.token:
            raise LeaseHeld(
                f"run {self.run_id!r} is being written by another process: {describe(current)}. "
                "Wait for it to finish or for its lease to expire, or stop that process."
            )
        if current is not None and current["token"] != self.token:
            why = "its process on this host is gone" if owner_gone(current) else "it expired"
            log.warning("run %s: taking over a stale lease, %s (%s)", self.run_id, why, describe(current))
        self.store.write_bytes(lease_key(self.run_id), json.dumps(self._record()).encode())
        time.sleep(self.settle)  # let a racing writer's PUT land before we look
        confirmed = read_lease(self.store, self.run_id)
        if confirmed is None or confirmed["token"] != self.token:
            raise LeaseHeld(
                f"run {self.run_id!r}: another process claimed the lease at the same moment"
                + (f" ({describe(confirmed)})" if confirmed else "")
                + "; not starting."
            )
        checkpoint.COMMIT_GUARDS.append(self._guard)
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def check(self) -> None:
        """Raise LeaseLost unless the stored lease still carries our token (one read)."""
        if self.lost is None:
            current = read_lease(self.store, self.run_id)
            if current is None or current["token"] != self.token:
                self.lost = f"now held by {describe(current)}" if current else "the lease object was deleted"
        if self.lost is not None:
            raise LeaseLost(f"run {self.run_id!r}: this process lost its lease ({self.lost}); stopping writes")

    def renew(self) -> None:
        self.check()
        self.store.write_bytes(lease_key(self.run_id), json.dumps(self._record()).encode())

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.renew()
            except LeaseLost as e:
                log.error("%s", e)
                return
            except Exception as e:  # storage trouble: the lease stays valid until it expires; try again
                log.warning("run %s: lease renewal failed (%s); retrying", self.run_id, type(e).__name__)

    def _guard(self, store: Store, key: str) -> None:
        if store.root == self.store.root and key.startswith(run_dir(self.run_id) + "/"):
            self.check()

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._guard in checkpoint.COMMIT_GUARDS:
            checkpoint.COMMIT_GUARDS.remove(self._guard)
        current = read_lease(self.store, self.run_id)
        if current is not None and current["token"] == self.token:
            self.store.delete(lease_key(self.run_id))

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


_HELD: dict[tuple[str, str], Lease] = {}  # (store URI, run id) -> the lease this process holds


@contextlib.contextmanager
def hold_run(store: Store, run_id: str) -> Iterator[Lease]:
    """The run's lease for the length of the block; re-entrant within a process.

    The CLI takes it before it writes anything of a run (recipe.json) and before Prefect starts, so a second
    writer is refused in one line; the flow inside takes it again and gets the same lease."""
    key = (store.uri(""), run_id)
    if key in _HELD:
        yield _HELD[key]
        return
    with Lease(store, run_id) as lease:
        _HELD[key] = lease
        try:
            yield lease
        finally:
            del _HELD[key]
