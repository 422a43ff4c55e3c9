"""One cgroup per sandbox run: a memory limit on the program's processes together, kernel memory included.

RLIMIT_AS is per process and does not see kernel memory: 30 socket pairs held 470 MiB under
memory_mb=128, and 16 children 710 MB under memory_mb=64.  A memory cgroup charges every page of the
program's process tree to one counter (socket buffers, pipes and page tables included) and the kernel
kills a process of the tree when the counter would pass memory_mb.  A pids cgroup, where there is one,
bounds the tree's processes and threads as well.

Both cgroup v1 (one hierarchy per controller) and v2 are used.  v2 only where the caller's own cgroup
already hands memory down to its children (its cgroup.subtree_control lists it): enabling it there
ourselves would change the cgroup of every process beside the caller.  Each run's group is a directory
``cascade-sandbox/<caller pid>-<n>`` below the caller's own cgroup, so the caller's own limits still
hold above it.  The groups of a caller that died (kill -9) are removed when the next caller probes.

The caller creates the group, the sandbox's init moves the program into it before the program runs
(child._init_main), and afterwards the caller asks whether the kernel killed for memory and removes
the group.  Standard library only.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

__all__ = ["Group", "available", "create"]

_log = logging.getLogger(__name__)
_MOUNTINFO = "/proc/self/mountinfo"
_OWN_CGROUPS = "/proc/self/cgroup"
_PARENT = "cascade-sandbox"
_CONTROLLERS = ("memory", "pids")
_MIB = 1024 * 1024
_REMOVE_SECONDS = 5.0

_names = itertools.count()
_lock = threading.Lock()
_found: list[_Hierarchy] | None = None  # usable hierarchies, probed once per process


@dataclass(frozen=True)
class _Hierarchy:
    version: int  # 1 or 2
    controllers: frozenset[str]  # the ones of _CONTROLLERS that we may use in it
    parent: str  # the cascade-sandbox/ directory in it


@dataclass(frozen=True)
class Group:
    """The cgroup of one sandbox run: a directory in each usable hierarchy."""

    dirs: tuple[tuple[_Hierarchy, str], ...]

    def procs_files(self) -> list[str]:
        """Where the init writes the program's pid."""
        return [os.path.join(path, "cgroup.procs") for _, path in self.dirs]

    def memory_exceeded(self) -> bool:
        """Whether the kernel killed a process of the run for passing the memory limit."""
        for hierarchy, path in self.dirs:
            if "memory" in hierarchy.controllers:
                events = "memory.oom_control" if hierarchy.version == 1 else "memory.events"
                return _read_field(os.path.join(path, events), "oom_kill") > 0
        return False

    def remove(self) -> None:
        for _, path in self.dirs:
            _remove(path)


def available() -> bool:
    """Whether runs get a memory cgroup here (probed once; a warning says once why not)."""
    return any("memory" in h.controllers for h in _hierarchies())


def create(memory_mb: int, max_processes: int) -> Group:
    """A new group with these limits, in every usable hierarchy."""
    return _create_in(_hierarchies(), memory_mb, max_processes)


def _create_in(hierarchies: list[_Hierarchy], memory_mb: int, max_processes: int) -> Group:
    name = f"{os.getpid()}-{next(_names)}"
    made: list[tuple[_Hierarchy, str]] = []
    try:
        for hierarchy in hierarchies:
            path = os.path.join(hierarchy.parent, name)
            os.mkdir(path, 0o755)
            made.append((hierarchy, path))
            _write_limits(hierarchy, path, memory_mb, max_processes)
    except OSError:
        Group(tuple(made)).remove()
        raise
    return Group(tuple(made))


def _write_limits(hierarchy: _Hierarchy, path: str, memory_mb: int, max_processes: int) -> None:
    if "memory" in hierarchy.controllers:
        memory = str(memory_mb * _MIB)
        if hierarchy.version == 1:
            _write(path, "memory.limit_in_bytes", memory)
            # Memory plus swap, where swap is accounted: pages pushed to swap would leave the limit.
            _write_if_present(path, "memory.memsw.limit_in_bytes", memory)
        else:
            _write(path, "memory.max", memory)
            _write_if_present(path, "memory.swap.max", "0")
    if "pids" in hierarchy.controllers:
        _write(path, "pids.max", str(max_processes))


def _hierarchies() -> list[_Hierarchy]:
    global _found
    with _lock:
        if _found is None:
            _found = _probe()
        return _found


def _probe() -> list[_Hierarchy]:
    usable, problems = [], []
    try:
        candidates = _candidates()
    except (OSError, ValueError) as exc:  # no /proc/self/cgroup, or one we cannot parse
        candidates, problems = [], [f"reading our own cgroups: {exc}"]
    for hierarchy in candidates:
        try:
            _prepare(hierarchy)
            _create_in([hierarchy], 64, 8).remove()  # can we really write its limits?
        except OSError as exc:
            problems.append(f"{hierarchy.parent}: {exc.strerror or exc}")
            continue
        usable.append(hierarchy)
    if not any("memory" in h.controllers for h in usable):
        why = "; ".join(problems) or "no cgroup memory controller mounted"
        _log.warning(
            "sandbox: no writable cgroup memory controller (%s): memory is limited per process only "
            "(RLIMIT_AS: a program's processes together may hold memory_mb x max_processes), and "
            "socket buffers are held to the kernel's default size only where seccomp runs",
            why,
        )
    return usable


def _prepare(hierarchy: _Hierarchy) -> None:
    os.makedirs(hierarchy.parent, 0o755, exist_ok=True)
    if hierarchy.version == 2:
        # Hand the controllers down to each run's group.
        _write(hierarchy.parent, "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(hierarchy.controllers)))
    _remove_stale(hierarchy.parent)


def _remove_stale(parent: str) -> None:
    """Remove the groups of callers that died without removing them (kill -9)."""
    for name in os.listdir(parent):
        owner = name.split("-")[0]
        path = os.path.join(parent, name)
        if owner.isdigit() and os.path.isdir(path) and not _alive(int(owner)):
            _remove(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _candidates() -> list[_Hierarchy]:
    """The hierarchies holding memory or pids, as seen from our own cgroup."""
    own = _own_cgroups()
    out = []
    for fstype, root, mount_point, options in _cgroup_mounts():
        if fstype == "cgroup":
            controllers = frozenset(_CONTROLLERS) & options
            own_path = next((path for names, path in own if controllers & names), None)
        else:
            own_path = next((path for names, path in own if not names), None)
        if own_path is None or not (own_path + "/").startswith(root.rstrip("/") + "/"):
            continue  # our cgroup is not below this mount
        own_dir = os.path.join(mount_point, own_path[len(root.rstrip("/")) :].lstrip("/"))
        if fstype == "cgroup2":
            controllers = _handed_down(own_dir)
        if controllers:
            out.append(_Hierarchy(1 if fstype == "cgroup" else 2, controllers, os.path.join(own_dir, _PARENT)))
    return out


def _handed_down(own_dir: str) -> frozenset[str]:
    """The controllers of ours that a v2 cgroup gives its children."""
    try:
        return frozenset(_CONTROLLERS) & set(_read(own_dir, "cgroup.subtree_control").split())
    except OSError:
        return frozenset()


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, root, mount point, super options) of each cgroup mount."""
    mounts = []
    with open(_MOUNTINFO) as fh:
        for line in fh:
            fields, _, tail = line.partition(" - ")
            fstype, _source, options = (tail.split() + ["", "", ""])[:3]
            if fstype in ("cgroup", "cgroup2"):
                root, mount_point = fields.split()[3:5]
                mounts.append((fstype, root, mount_point, set(options.split(","))))
    return mounts


def _own_cgroups() -> list[tuple[set[str], str]]:
    """(controllers, path) of each line of /proc/self/cgroup; v2's line has no controllers."""
    out = []
    with open(_OWN_CGROUPS) as fh:
        for line in fh:
            _, names, path = line.rstrip("\n").split(":", 2)
            out.append((set(names.split(",")) - {""}, path))
    return out


def _remove(path: str) -> None:
    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                _log.warning("sandbox: could not remove cgroup %s: %s", path, exc.strerror)
                return
        _kill_members(path)  # EBUSY: processes of the run are still in it
        time.sleep(0.02)


def _kill_members(path: str) -> None:
    """SIGKILL every process still in the group."""
    if os.path.exists(os.path.join(path, "cgroup.kill")):  # v2: one write, no pid to race for
        _write(path, "cgroup.kill", "1")
        return
    for pid in _members(path):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone already
        try:
            # Pinned by the pidfd, the pid cannot be reused; if it is still a member it is ours to kill.
            if pid in _members(path):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def _members(path: str) -> list[int]:
    try:
        return [int(pid) for pid in _read(path, "cgroup.procs").split()]
    except OSError:
        return []


def _read_field(path: str, key: str) -> int:
    """The value of ``key`` in a file of "key value" lines (0 if absent)."""
    with open(path) as fh:
        for line in fh:
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as fh:
        return fh.read()


def _write(directory: str, name: str, value: str) -> None:
    with open(os.path.join(directory, name), "w") as fh:
        fh.write(value)


def _write_if_present(directory: str, name: str, value: str) -> None:
    if os.path.exists(os.path.join(directory, name)):
        _write(directory, name, value)
