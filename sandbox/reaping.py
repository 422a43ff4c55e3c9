"""Waiting for a process and killing what a program left, for both sides of the sandbox: the child (child.py, which
loads this file by path, as it runs under ``-I -S``) and the supervisor. Standard library only, and nothing of ours.
"""

from __future__ import annotations

import os
import select
import signal
import time


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait until ``pid`` (a child) has exited, without reaping it."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return _poll_exit(pid, timeout)
    try:
        return bool(select.select([pidfd], [], [], max(0.0, timeout))[0])
    finally:
        os.close(pidfd)


def _poll_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def kill_all_of_uid(uid: int) -> None:
    """kill(-1) from a helper running as the sandbox uid: one call reaches every
    process of that uid and nothing else, so a fork bomb cannot outrun it."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(200):
                os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            os._exit(0)  # nothing left to signal
        except BaseException:  # noqa: BLE001
            os._exit(1)
        os._exit(0)
    os.waitpid(helper, 0)


def kill_descendants() -> None:
    """SIGKILL the whole tree below us, reap, repeat until nothing is left.

    As child subreaper we inherit every orphan, even ones that called setsid(),
    so nothing can leave the tree; killing all of it in one sweep (not child
    by child) stops a fork bomb from refilling it.  RLIMIT_NPROC bounds it.
    A pid found in /proc may die and be reused by an unrelated process before
    we signal it, so each is pinned with a pidfd and its ancestry re-checked."""
    me = os.getpid()
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        doomed = _descendants_of(me, _parent_map())
        if not doomed:
            return
        pinned = {pid: _pidfd(pid) for pid in doomed}
        still_ours = set(_descendants_of(me, _parent_map()))
        for pid, pidfd in pinned.items():
            if pidfd == -1:
                continue
            try:
                if pidfd is None:
                    os.kill(pid, signal.SIGKILL)  # no pidfd support: best effort
                elif pid in still_ours:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                if pidfd is not None:
                    os.close(pidfd)
        _reap_children(deadline)


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``; -1 if it is already gone; None without pidfd support."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except (AttributeError, OSError):
        return None


def _reap_children(deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def _parent_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _descendants_of(root: int, children: dict[int, list[int]]) -> list[int]:
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found
