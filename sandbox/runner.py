"""Run untrusted, model-written Python so that it cannot hurt the host.

Used by the code and swe graders (RL reward, HumanEval/MBPP eval).  Standard
library only; Linux only.

What it provides (strongest layers first; ``isolation_mode()`` says which ran)
-------------------------------------------------------------------------------
Every program runs under a small launcher: this very file executed as a script
("bootstrap", B), which forks an init (I) that forks the user program (U).

* ``netns``   - a fresh network namespace: only a downed loopback, so neither
  the internet nor the host's 127.0.0.1 services are reachable.
* ``pidns``   - a fresh pid namespace with its own /proc: the program sees no
  host process, cannot signal one, and everything it spawns dies with I.
* ``mntns``   - a private mount namespace in which every mount is remounted
  read-only and nosuid; /tmp is an empty read-only tmpfs holding the working
  directory (a small writable tmpfs, the only writable place apart from a
  private /dev/shm; both bounded in bytes and in inodes, so a flood of empty
  files cannot pin kernel memory either); /var/tmp, /run, /root, /home, the
  caller's $HOME and this project's checkout are hidden under empty read-only
  tmpfs mounts.
* ``userns``  - only when the caller is not root: a user namespace so that the
  namespaces above can be created unprivileged; U then drops every capability.
* ``setuid``  - only when the caller is root: U runs as an otherwise unused uid
  (one per concurrent sandbox, from 65000 up, configurable with
  CASCADE_SANDBOX_UID_BASE; a uid that still owns processes is skipped), so
  RLIMIT_NPROC is enforced (root ignores it) and nothing owned by root
  (/root, /etc/shadow, the caller) is reachable or signallable.
* ``seccomp`` - a seccomp-bpf filter; these fail with EPERM:
  - socket() of every family, AF_UNIX included: netns separates only abstract
    Unix sockets, and a read-only mount does not stop connect(), so a host
    service on a socket file the sandbox uid may write (a world-writable
    /dev/log, a chmod-ed docker.sock) would otherwise be reachable;
  - socketpair() other than AF_UNIX/SOCK_STREAM: a stream pair is born
    connected and cannot be pointed at a socket file (a datagram pair can be,
    with sendto); asyncio and multiprocessing's pipes need nothing more;
  - memfd_create, memfd_secret and SysV shmget/semget/msgget: their memory is
    in no address space, so RLIMIT_AS does not count it;
  - setsockopt SO_SNDBUF/SO_RCVBUF (and their FORCE forms): a socket keeps the
    kernel's default buffer size, so socket pairs cannot hoard kernel memory;
  - namespace/mount syscalls, ptrace, bpf, io_uring, keyrings, perf and
    userfaultfd.
  Survives exec, so it covers subprocesses too.
* ``cgroup``  - where a cgroup memory controller is writable (cgroup.py): the
  program's processes together, kernel memory (socket buffers, pipes) included,
  may hold at most memory_mb; passing it kills a process of the program and
  the verdict is "fail" with a "memory limit ... exceeded" note.  A pids
  controller, where writable too, bounds the tree to max_processes.  The init
  is not in the group.  Where no memory controller is writable, the sandbox
  logs one warning when it starts.
* ``rlimits`` - CPU seconds, address space, processes, file size, open files,
  no core dumps.  Always on.  Without ``cgroup``, RLIMIT_AS is the only memory
  limit, per process (see below).
* ``socket-preamble`` - last resort when neither netns nor seccomp can run:
  socket.socket is replaced before the program starts so that no new socket
  of any family can be made (socketpair() still works).  Python-level only:
  ctypes, _socket or a subprocess bypass it.  The mode string says so when it
  is used.

Always: a minimal environment built from scratch (no AWS_*, MLFLOW_*, tokens,
keys or passwords of the caller), ``-I -B`` isolated interpreter, a fresh
working directory removed afterwards, its own session/process group, a wall
clock limit enforced by I and, as a backstop, by the caller killing the whole
process group (after killing every process of the sandbox uid when there is
no pid namespace), stdout/stderr each read through a bounded reader (the rest is
drained and discarded; stderr may end with one "[sandbox] ..." line saying
why a run did not pass), and a reaping init (child subreaper) so no zombie or
orphan survives a verdict.

What it does NOT provide
------------------------
* No kernel isolation: a kernel exploit escapes (use a VM/gVisor for that).
* Without ``cgroup``: total memory is per-process RLIMIT_AS times
  max_processes (plus the tmpfs sizes); kernel memory held in pipes and socket
  buffers is bounded only through the open-file and process limits (with
  ``seccomp`` sockets keep the default buffer: about 13 MiB per process at 64
  open files).  Without ``seccomp`` (an architecture other than x86_64/aarch64)
  memfd and SysV shared memory escape RLIMIT_AS and socket buffers may grow to
  the kernel's wmem_max/rmem_max.
  CPU contention with the host is not throttled, only bounded in time.
* Without mntns the host's world-writable directories (/tmp, /var/tmp, /dev/shm)
  stay writable and world-readable files stay readable, and the working
  directory is on the host's /tmp, bounded by RLIMIT_FSIZE per file only.
  Without pidns and setuid (non-root caller, no namespaces) the program runs
  as the caller's uid: it can read the caller's files and /proc/<pid>/environ
  and signal the caller's processes.  Such modes are reported honestly in ``isolation``.
* World-readable files outside the hidden paths (/usr, /etc/passwd, other
  checkouts) stay readable; nothing can be written there.
* Without ``seccomp`` a host service on a socket file that the program's uid
  may write is reachable.  With it, programs that need socket() fail:
  multiprocessing's Manager and forkserver start method (the default fork one
  works), logging's SysLogHandler.
* Only the exit status is judged: a program that calls os._exit(0) before
  the grader's appended asserts run "passes".  Graders that need more should
  print a per-run nonce after the asserts and check stdout for it.
* A root caller whose uid drop fails (e.g. a container without those uids
  mapped) gets a mode without ``setuid``: RLIMIT_NPROC is then not enforced.
* Two caller processes starting sandboxes at the same instant may pick the
  same uid and share its RLIMIT_NPROC budget (the busy-uid check is racy).

Interpreter choice: the program runs under ``sys.executable`` when the sandbox
uid can execute it; otherwise (here: pyenv lives under /root, mode 700) under
the first world-executable of /usr/bin/python3 or /usr/local/bin/python3, or
CASCADE_SANDBOX_PYTHON if set.  Graded programs only need the standard library.
The real binary is run (never a venv shim), so venv packages are not visible,
and ``-I`` keeps the working directory off sys.path: programs are single files.
The program runs at nice 10 so that the host and the init stay responsive.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource  # also needed by os.wait4, and must be loaded before /root is hidden
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import dataclasses
from dataclasses import dataclass
from typing import Literal

try:
    from cascade.sandbox import cgroup
except ImportError:  # run as the bootstrap script, or loaded as a bare file: no cgroup layer
    cgroup = None

__all__ = ["SandboxLimits", "Verdict", "isolation_mode", "run_python", "run_many"]


@dataclass(frozen=True)
class SandboxLimits:
    cpu_seconds: int = 5  # RLIMIT_CPU
    wall_seconds: float = 10.0  # killed (whole process group) after this
    memory_mb: int = 1024  # RLIMIT_AS per process; with the cgroup layer, all its processes together too
    max_processes: int = 32  # RLIMIT_NPROC (enforced through the uid drop); pids.max with the cgroup layer
    file_size_mb: int = 16  # RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE
    output_bytes: int = 65536  # stdout/stderr each truncated to this
    max_inodes: int = 4096  # nr_inodes of each writable tmpfs (working directory, /dev/shm)


@dataclass(frozen=True)
class Verdict:
    status: Literal["pass", "fail", "timeout", "error"]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: str

    @property
    def passed(self) -> bool:
        return self.status == "pass"


_log = logging.getLogger(__name__)
_HERE = os.path.abspath(__file__)
_PROJECT_ROOT = os.path.dirname(os.path.dirname(_HERE))
_LAYER_ORDER = ("userns", "netns", "pidns", "mntns", "setuid", "seccomp", "cgroup", "rlimits", "socket-preamble")
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_BACKSTOP_GRACE = 5.0  # seconds the caller waits beyond wall_seconds before killing the group itself
_STATUS_MAX = 1 << 16

_PREAMBLE = """\
import socket as _s, runpy as _r
class _NoNet(_s.socket):
    def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
        if fileno is None:  # a new socket; socketpair() and accept() wrap existing fds
            raise PermissionError(1, "sockets disabled by sandbox")
        super().__init__(family, type, proto, fileno)
_s.socket = _s.SocketType = _NoNet
def _deny(*a, **k):
    raise PermissionError(1, "sockets disabled by sandbox")
_s.create_connection = _s.getaddrinfo = _s.fromfd = _deny
del _s
_r.run_path("main.py", run_name="__main__")
"""


# --------------------------------------------------------------------------
# caller side
# --------------------------------------------------------------------------

_mode_lock = threading.Lock()
_mode_layers: tuple[str, ...] | None = None


def isolation_mode() -> str:
    """The isolation run_python uses on this machine (probed once, cached)."""
    return _mode_name(_layers())


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> Verdict:
    """Run ``code`` as a program in the sandbox and judge it by its exit status."""
    return _execute_safely(code, limits, _layers())


def run_many(
    programs: list[str], limits: SandboxLimits = SandboxLimits(), max_workers: int | None = None
) -> list[Verdict]:
    """Run programs in parallel (at most os.cpu_count() at once); order preserved."""
    if not programs:
        return []
    from concurrent.futures import ThreadPoolExecutor

    layers = _layers()  # probe once, before the threads race for it
    cpus = os.cpu_count() or 1
    workers = max(1, min(max_workers or cpus, cpus, len(programs)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda c: _execute_safely(c, limits, layers), programs))


def _mode_name(layers: tuple[str, ...]) -> str:
    return "+".join(layers) if layers else "unavailable"


def _layers() -> tuple[str, ...]:
    global _mode_layers
    with _mode_lock:
        if _mode_layers is None:
            _mode_layers = _probe()
        return _mode_layers


def _candidate_layer_sets() -> list[tuple[str, ...]]:
    """Strongest first; the probe keeps the first that really runs a program."""
    root = os.geteuid() == 0
    user = () if root else ("userns",)
    namespaces = [user + ("netns", "pidns", "mntns"), user + ("netns",), ()]
    privilege = [("setuid",), ()] if root else [()]
    filters = [("seccomp",), ()] if _seccomp_arch() else [()]
    groups = [("cgroup",), ()] if cgroup is not None and cgroup.available() else [()]
    out = []
    for ns in namespaces:
        for priv in privilege:
            for filt in filters:
                for group in groups:
                    layers = set(ns + priv + filt + group + ("rlimits",))
                    if "netns" not in layers and "seccomp" not in layers:
                        layers.add("socket-preamble")
                    out.append(tuple(name for name in _LAYER_ORDER if name in layers))
    return out


def _probe() -> tuple[str, ...]:
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=20.0)
    failures = []
    for layers in _candidate_layer_sets():
        verdict = _execute("import sys\nsys.exit(0)\n", limits, layers)
        if verdict.status == "pass":
            if failures:  # a weaker mode than this machine might allow: say why
                _log.warning("sandbox: using %s; stronger modes failed: %s", _mode_name(layers), "; ".join(failures))
            return layers
        failures.append(f"{_mode_name(layers)}: {verdict.stderr.strip()[-300:]}")
    _log.error("sandbox: no isolation mode works here: %s", "; ".join(failures))
    return ()


class _UidPool:
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
        busy = _uids_with_processes()
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


def _uids_with_processes() -> set[int]:
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                continue
    return uids


_uids = _UidPool(int(os.environ.get("CASCADE_SANDBOX_UID_BASE", "65000")))


def _execute_safely(code: str, limits: SandboxLimits, layers: tuple[str, ...]) -> Verdict:
    # A grader batch must not die because one run hit a host-side problem
    # (full disk, exhausted uid pool...): that run becomes an "error" verdict.
    try:
        return _execute(code, limits, layers)
    except Exception as exc:  # noqa: BLE001
        return Verdict("error", None, "", f"[sandbox] internal error: {exc!r}", 0.0, _mode_name(layers))


def _execute(code: str, limits: SandboxLimits, layers: tuple[str, ...]) -> Verdict:
    start = time.monotonic()
    mode = _mode_name(layers)
    if not layers:
        return Verdict("error", None, "", "sandbox unavailable on this machine", 0.0, mode)
    python = _sandbox_python("setuid" in layers)
    if python is None:
        msg = "no interpreter the sandbox user can execute; set CASCADE_SANDBOX_PYTHON"
        return Verdict("error", None, "", msg, 0.0, mode)
    uid = _uids.acquire() if "setuid" in layers else None
    workdir = tempfile.mkdtemp(prefix="cascade-sbx-")
    group = None
    try:
        group = cgroup.create(limits.memory_mb, limits.max_processes) if "cgroup" in layers else None
        _write_program(workdir, code, uid, "mntns" in layers)
        inner = os.path.join("/tmp", os.path.basename(workdir)) if "mntns" in layers else workdir
        config = {
            "layers": list(layers),
            "limits": dataclasses.asdict(limits),
            "uid": uid,
            "python": python,
            "workdir": inner,
            "hide": _paths_to_hide(python) if "mntns" in layers else [],
            "env": _sandbox_env(inner),
            "cgroup_procs": group.procs_files() if group else [],
        }
        return _supervise(config, workdir, limits, start, mode, group)
    finally:
        if uid is not None:
            _uids.release(uid)
        if group is not None:
            group.remove()
        _remove_tree(workdir)


def _write_program(workdir: str, code: str, uid: int | None, private_copy: bool) -> None:
    path = os.path.join(workdir, "main.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(code)
    # With mntns the bootstrap copies main.py into a private tmpfs, so the host
    # directory can stay root-only; otherwise the sandbox uid works in it.
    if uid is not None and not private_copy:
        os.chown(workdir, uid, uid)
        os.chown(path, uid, uid)


def _sandbox_env(workdir: str) -> dict[str, str]:
    # Built from nothing: no variable of the caller (AWS_*, tokens, ...) leaks.
    return {
        "PATH": _SAFE_PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


def _sandbox_python(setuid: bool) -> str | None:
    override = os.environ.get("CASCADE_SANDBOX_PYTHON")
    candidates = [override] if override else [
        sys.executable,
        getattr(sys, "_base_executable", None),
        "/usr/bin/python3",
        "/usr/local/bin/python3",
    ]
    for candidate in candidates:
        if not candidate:
            continue
        # The real binary, not a venv shim: the program gets a plain stdlib
        # interpreter and the path stays valid inside the mount namespace.
        real = os.path.realpath(candidate)
        if os.path.isfile(real) and (not setuid or _world_executable(real)):
            return real
    return None


def _world_executable(path: str) -> bool:
    """True if a uid with no relation to the owner can execute ``path``."""
    try:
        if stat.S_IMODE(os.stat(path).st_mode) & 0o005 != 0o005:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _paths_to_hide(python: str) -> list[str]:
    candidates = [_PROJECT_ROOT, "/root", "/home", os.path.expanduser("~")]
    out: list[str] = []
    for path in candidates:
        path = os.path.realpath(path)
        if path == "/" or path in out or not os.path.isdir(path) or os.path.islink(path):
            continue
        if (python + "/").startswith(path + "/") or (path + "/").startswith("/tmp/"):
            continue  # would hide the interpreter itself / lives in the private /tmp anyway
        out.append(path)
    return out


def _bootstrap_env() -> dict[str, str]:
    return {"PATH": _SAFE_PATH, "LANG": "C.UTF-8"}


def _supervise(
    config: dict, workdir: str, limits: SandboxLimits, start: float, mode: str, group: cgroup.Group | None
) -> Verdict:
    status_r, status_w = os.pipe()
    config["status_fd"] = status_w
    argv = [sys.executable, "-I", "-S", "-B", _HERE, json.dumps(config)]
    try:
        proc = subprocess.Popen(
            argv, cwd=workdir, env=_bootstrap_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(status_w,),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(status_r)
        os.close(status_w)
        return Verdict("error", None, "", f"could not start sandbox: {exc}", time.monotonic() - start, mode)
    os.close(status_w)
    readers = [_BoundedReader(proc.stdout, limits.output_bytes), _BoundedReader(proc.stderr, limits.output_bytes)]
    exited = _wait_exit(proc.pid, limits.wall_seconds + _BACKSTOP_GRACE)
    if not exited and config["uid"] is not None and "pidns" not in config["layers"]:
        # Take the program's tree down first and give our init a moment to
        # reap it: orphans of a killed init would go to the host's init, which
        # in a container may never reap them.
        _kill_uid(config["uid"], config["python"])
        _wait_exit(proc.pid, 2.0)
    # The bootstrap is still unreaped here, so its pid (= the group id) cannot
    # have been recycled: killing the group cannot hit an unrelated process.
    _kill_group(proc.pid)
    proc.wait()
    report = _read_status(status_r)
    stdout, stderr = (reader.result(timeout=5.0) for reader in readers)
    seconds = time.monotonic() - start
    memory_exceeded = group is not None and group.memory_exceeded()
    status, returncode, note = _judge(report, exited, proc.returncode, limits, memory_exceeded)
    if note:
        stderr = (stderr + ("\n" if stderr else "") + f"[sandbox] {note}")
    return Verdict(status, returncode, stdout, stderr, seconds, mode)


def _judge(
    report: dict | None, exited: bool, boot_rc: int, limits: SandboxLimits, memory_exceeded: bool
) -> tuple[str, int | None, str]:
    """Map the init's report to (status, returncode, note for stderr)."""
    if not exited:
        return "timeout", None, f"killed by the caller after {limits.wall_seconds}s wall time"
    if report is None:
        return "error", None, f"sandbox bootstrap ended without a report (exit {boot_rc})"
    kind = report.get("kind")
    if kind == "error":
        return "error", None, str(report.get("message"))
    if kind == "timeout":
        return "timeout", None, f"wall time limit of {limits.wall_seconds}s exceeded"
    if memory_exceeded:  # even if the program survived the kernel killing one of its children
        code = -int(report["signal"]) if kind == "signal" else int(report.get("code", 1))
        note = f"memory limit of {limits.memory_mb} MB exceeded (all its processes, kernel memory included)"
        return "fail", code, note
    if kind == "signal":
        sig = int(report["signal"])
        cpu = float(report.get("cpu", 0.0))
        # SIGXCPU is the soft CPU limit; SIGKILL near the limit is the hard one.
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= limits.cpu_seconds - 0.05):
            return "timeout", -sig, f"CPU time limit of {limits.cpu_seconds}s exceeded"
        return "error", -sig, f"killed by signal {_signal_name(sig)}"
    code = int(report.get("code", 1))
    return ("pass" if code == 0 else "fail"), code, ""


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def _read_status(fd: int) -> dict | None:
    """The first error line wins, else the last report."""
    data = b""
    try:
        os.set_blocking(fd, False)
        while len(data) < _STATUS_MAX:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    reports = []
    for line in data.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:
            continue
    errors = [r for r in reports if r.get("kind") == "error"]
    return errors[0] if errors else (reports[-1] if reports else None)


class _BoundedReader:
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


def _wait_exit(pid: int, timeout: float) -> bool:
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


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_uid(uid: int, python: str) -> None:
    """Kill every process of the sandbox uid (only needed without a pid namespace).

    kill(-1) from a process running as that uid reaches exactly its processes,
    including any that left the process group with setsid()."""
    killer = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    for _ in range(3):
        try:
            subprocess.run([python, "-I", "-S", "-c", killer], user=uid, group=uid, extra_groups=[],
                           env=_bootstrap_env(), cwd="/", stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return


def _remove_tree(path: str) -> None:
    def _unlock_and_retry(func, target, _exc):
        # The program may have chmod-ed its own files to 000.
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    shutil.rmtree(path, onerror=_unlock_and_retry)


# --------------------------------------------------------------------------
# sandbox side: this file run as a script (bootstrap B -> init I -> program U)
# --------------------------------------------------------------------------

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 22, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
_MOUNT_OPTION_FLAGS = {
    "ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}


class _Reporter:
    """One JSON line per event on the status pipe the caller handed us."""

    def __init__(self, fd: int):
        self.fd = fd
        os.set_inheritable(fd, False)  # closed on exec: the program never sees it

    def __call__(self, **event) -> None:
        try:
            os.write(self.fd, (json.dumps(event) + "\n").encode())
        except OSError:
            pass


def _bootstrap_main(argv: list[str]) -> None:
    config = json.loads(argv[0])
    report = _Reporter(int(config["status_fd"]))
    layers = set(config["layers"])
    try:
        with open("main.py", "rb") as fh:  # cwd is the host working directory
            code = fh.read()
        _enter_namespaces(layers)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an "error" verdict
        report(kind="error", message=f"sandbox setup failed: {exc!r}")
        os._exit(70)
    init = os.fork()
    if init == 0:
        _init_main(config, layers, code, report)
    _, status = os.waitpid(init, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter_namespaces(layers: set[str]) -> None:
    flags = 0
    if "netns" in layers:
        flags |= CLONE_NEWNET
    if "pidns" in layers:
        flags |= CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    if "mntns" in layers:
        flags |= CLONE_NEWNS
    if not flags:
        return
    if "userns" in layers:
        flags |= CLONE_NEWUSER
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc().unshare(flags), "unshare")
    if "userns" in layers:
        # An unprivileged process may map exactly its own ids, once.
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)


def _init_main(config: dict, layers: set[str], code: bytes, report: _Reporter) -> None:
    """Init of the sandbox: set up, run the program, kill whatever it left."""
    try:
        libc = _libc()
        # Orphans of the program re-parent to us (also without a pid namespace).
        _check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
        # The program exists before the mounts: it must be moved into its cgroup while /sys is still
        # writable, and only it (not this init) may be charged, so that running out of memory kills a
        # process of the program, never the init.
        program, release = _fork_held_program(config, layers, report)
        _move_into_cgroup(program, config["cgroup_procs"])
        if "mntns" in layers:
            _setup_mounts(libc, config, layers, code)
        if "pidns" in layers:  # comes with its own UTS namespace
            libc.sethostname(b"sandbox", 7)
        os.chdir("/")  # do not keep the host directory reachable via /proc/1/cwd
    except Exception as exc:  # noqa: BLE001
        report(kind="error", message=f"sandbox setup failed: {exc!r}")
        os._exit(70)  # the held program reads end of file and exits too
    os.write(release, b"go")
    os.close(release)
    event = _wait_program(program, float(config["limits"]["wall_seconds"]))
    if "pidns" not in layers:
        if config["uid"] is not None:
            _kill_all_of_uid(int(config["uid"]))
        _kill_descendants()
    # As pid 1 our exit makes the kernel kill and reap the whole namespace.
    report(**event)
    os._exit(0)


def _fork_held_program(config: dict, layers: set[str], report: _Reporter) -> tuple[int, int]:
    """Fork the program, held until the init writes b"go" to ``release``; returns (pid, release)."""
    held, release = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(release)
            if os.read(held, 2) != b"go":  # end of file: the init's setup failed
                os._exit(70)
            os.close(held)
        except BaseException:  # noqa: BLE001 - must never return into the init's code
            os._exit(70)
        _exec_program(config, layers, report)
    os.close(held)
    return pid, release


def _move_into_cgroup(pid: int, procs_files: list[str]) -> None:
    for path in procs_files:
        with open(path, "w") as fh:
            fh.write(str(pid))


def _wait_program(pid: int, wall: float) -> dict:
    timed_out = not _wait_exit(pid, wall)
    if timed_out:
        os.kill(pid, signal.SIGKILL)  # still unreaped, so the pid is still ours
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if timed_out:
        return {"kind": "timeout", "cpu": cpu}
    if os.WIFSIGNALED(status):
        return {"kind": "signal", "signal": os.WTERMSIG(status), "cpu": cpu}
    return {"kind": "exit", "code": os.WEXITSTATUS(status), "cpu": cpu}


def _kill_all_of_uid(uid: int) -> None:
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


def _kill_descendants() -> None:
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


def _mount(libc, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _setup_mounts(libc, config: dict, layers: set[str], code: bytes) -> None:
    # Private first: otherwise shared mounts would propagate to the host.
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)
    if "pidns" in layers:
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _remount_all_readonly(libc)
    limits = config["limits"]
    owner = config["uid"] if config["uid"] is not None else 0
    workdir = config["workdir"]
    _mount(libc, "tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    os.mkdir(workdir, 0o700)
    size_mb = max(32, 2 * int(limits["file_size_mb"]))
    # An empty file costs no tmpfs block but ~1 KiB of kernel memory: only nr_inodes bounds a flood of them.
    inodes = int(limits["max_inodes"])
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=700,uid={owner},gid={owner}"
    _mount(libc, "tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    program = os.path.join(workdir, "main.py")
    with open(program, "wb") as fh:
        fh.write(code)
    os.chown(program, owner, owner)
    # /tmp itself is read-only: only the working directory below it is writable.
    _mount(libc, None, "/tmp", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if os.path.isdir("/dev/shm") and not os.path.islink("/dev/shm"):
        # Writable (POSIX semaphores of multiprocessing need it) but private.
        _mount(libc, "tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               f"size=16m,nr_inodes={inodes},mode=1777")
    for path in ["/var/tmp", "/run"] + list(config["hide"]):
        if os.path.isdir(path) and not os.path.islink(path):
            _mount(libc, "tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=755")


def _unescape_mountinfo(path: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _remount_all_readonly(libc) -> None:
    """Make every mount of this namespace read-only and nosuid.

    MS_BIND makes the remount per mount (this namespace's copy); without it
    the flags would change the host filesystem itself.  Existing per-mount
    flags are kept: dropping e.g. nosuid somewhere would weaken the host's
    choice, and the kernel refuses to drop locked ones anyway."""
    with open("/proc/self/mountinfo") as fh:
        lines = fh.read().splitlines()
    for line in lines:
        fields = line.split()
        target = _unescape_mountinfo(fields[4])
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        for option in fields[5].split(","):
            flags |= _MOUNT_OPTION_FLAGS.get(option, 0)
        try:
            _mount(libc, None, target, None, flags)
        except OSError:
            if target == "/" or not _tolerable_rw(target):
                raise


def _tolerable_rw(target: str) -> bool:
    """A mount we could not remount is acceptable if it is read-only anyway or a
    kernel filesystem whose files are root-owned (/proc, /sys, /dev)."""
    try:
        if os.statvfs(target).f_flag & os.ST_RDONLY:
            return True
    except OSError:
        return True  # unreachable path: nothing can write through it
    return any(target == p or target.startswith(p + "/") for p in ("/proc", "/sys", "/dev"))


def _exec_program(config: dict, layers: set[str], report: _Reporter) -> None:
    try:
        _apply_rlimits(config["limits"])
        uid = config["uid"]
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # also drops every capability
        elif os.geteuid() == 0:
            # Root of a user namespace, or real root whose uid drop is not
            # available: at least take away every capability.
            _drop_capabilities()
        os.chdir(config["workdir"])
        os.umask(0o077)
        os.nice(10)  # under contention the host, and our init, come first
        libc = _libc()
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        if "seccomp" in layers:
            _install_seccomp(libc)
        python = config["python"]
        if "socket-preamble" in layers:
            argv = [python, "-I", "-B", "-c", _PREAMBLE]
        else:
            argv = [python, "-I", "-B", "main.py"]
        os.execve(python, argv, config["env"])
    except BaseException as exc:  # noqa: BLE001 - must never return into the init's code
        report(kind="error", message=f"could not start the program: {exc!r}")
        os._exit(127)


def _apply_rlimits(limits: dict) -> None:
    mib = 1024 * 1024
    cpu = int(limits["cpu_seconds"])
    settings = [
        # Soft limit sends SIGXCPU, the hard one a second later SIGKILL.
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, int(limits["memory_mb"]) * mib, int(limits["memory_mb"]) * mib),
        (resource.RLIMIT_NPROC, int(limits["max_processes"]), int(limits["max_processes"])),
        (resource.RLIMIT_FSIZE, int(limits["file_size_mb"]) * mib, int(limits["file_size_mb"]) * mib),
        (resource.RLIMIT_NOFILE, int(limits["open_files"]), int(limits["open_files"])),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    for which, soft, hard in settings:
        resource.setrlimit(which, (soft, hard))


def _drop_capabilities() -> None:
    """For a program that has to keep uid 0 (userns mode, or no uid drop).

    Securebits stop exec from granting root the full set again; then the
    bounding set and the current sets are emptied."""
    libc = _libc()
    noroot, noroot_locked, no_fixup, no_fixup_locked = 1, 2, 4, 8
    keep_caps_locked, no_ambient, no_ambient_locked = 32, 64, 128
    bits = noroot | noroot_locked | no_fixup | no_fixup_locked | keep_caps_locked | no_ambient | no_ambient_locked
    _check(libc.prctl(PR_SET_SECUREBITS, bits, 0, 0, 0), "prctl(SET_SECUREBITS)")
    with open("/proc/sys/kernel/cap_last_cap") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), "prctl(CAPBSET_DROP)")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # effective/permitted/inheritable x 2 words, all zero
    _check(libc.capset(header, data), "capset")


# Syscall numbers from the kernel's uapi headers (x86_64: asm/unistd_64.h;
# aarch64: asm-generic/unistd.h).  audit arch: AUDIT_ARCH_X86_64 / _AARCH64.
_SECCOMP_ARCHES = {
    "x86_64": {
        "audit": 0xC000003E, "socket": 41, "socketpair": 53, "setsockopt": 54, "clone": 56, "clone3": 435,
        "deny": [101, 155, 161, 165, 166, 175, 246, 248, 249, 250, 272, 298, 308, 313, 321, 323,
                 425, 428, 429, 430, 431, 432, 442],
        "unaccounted": [29, 64, 68, 319, 447],
    },
    "aarch64": {
        "audit": 0xC00000B7, "socket": 198, "socketpair": 199, "setsockopt": 208, "clone": 220, "clone3": 435,
        "deny": [39, 40, 41, 51, 97, 104, 105, 117, 217, 218, 219, 241, 268, 273, 280, 282,
                 425, 428, 429, 430, 431, 432, 442],
        "unaccounted": [194, 190, 186, 279, 447],
    },
}
# deny = ptrace, pivot_root, chroot, mount, umount2, init_module, kexec_load,
# add_key, request_key, keyctl, unshare, perf_event_open, setns, finit_module,
# bpf, userfaultfd, io_uring_setup (io_uring could open sockets), open_tree,
# move_mount, fsopen, fsconfig, fsmount, mount_setattr.
# unaccounted = shmget, semget, msgget, memfd_create, memfd_secret: memory that
# is in no address space, so RLIMIT_AS does not see it (40 memfds of 16 MB held
# 640 MiB under a 128 MB limit); SysV objects would even outlive the run where
# there is no IPC namespace.  Nothing in the standard library needs them.


_SOL_SOCKET, _SO_SNDBUF, _SO_RCVBUF, _SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 1, 7, 8, 32, 33  # asm-generic/socket.h


def _seccomp_arch() -> dict | None:
    return _SECCOMP_ARCHES.get(os.uname().machine)


def _seccomp_program() -> list[tuple[int, int, int, int]]:
    arch = _seccomp_arch()
    if arch is None:
        raise OSError("seccomp filter not available for this architecture")
    ld_abs, jeq, jge, jset, and_k, ret = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    clone_new_mask = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | 0x02000000
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch["audit"]), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    if arch["audit"] == 0xC000003E:  # x32 ABI numbers (bit 30) on x86_64
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for nr in arch["deny"] + arch["unaccounted"]:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    # clone3 hides its flags in memory; glibc falls back to clone on ENOSYS.
    prog += [(jeq, 0, 1, arch["clone3"]), (ret, 0, 0, enosys)]
    # No socket() of any family: netns cuts AF_INET* off, but an AF_UNIX socket
    # can connect() to any socket file the uid may write (a read-only mount
    # does not stop that), e.g. a world-writable /dev/log or docker.sock.
    prog += [(jeq, 0, 1, arch["socket"]), (ret, 0, 0, eperm)]
    # socketpair(): AF_UNIX SOCK_STREAM only (asyncio and multiprocessing use
    # it).  A stream pair is born connected and refuses connect() and sendto()
    # with an address; a datagram pair could still address any socket file.
    # args[0] (family) and args[1] (type, flags masked off) at offsets 16, 24.
    prog += [(jeq, 0, 7, arch["socketpair"]), (ld_abs, 0, 0, 16), (jeq, 0, 4, 1), (ld_abs, 0, 0, 24),
             (and_k, 0, 0, 0xF), (jeq, 0, 1, 1), (ret, 0, 0, allow), (ret, 0, 0, eperm)]
    # setsockopt(): no SO_SNDBUF/SO_RCVBUF(FORCE) at SOL_SOCKET (args[1], args[2]): a socket keeps the
    # kernel's default buffer (about 208 KiB), where a program raising it to wmem_max held 470 MiB of
    # kernel memory in 30 socket pairs, outside RLIMIT_AS (a memory cgroup counts it where there is one).
    prog += [(jeq, 0, 9, arch["setsockopt"]), (ld_abs, 0, 0, 24), (jeq, 0, 6, _SOL_SOCKET), (ld_abs, 0, 0, 32)]
    prog += [(jeq, 3, 0, _SO_SNDBUF), (jeq, 2, 0, _SO_RCVBUF), (jeq, 1, 0, _SO_SNDBUFFORCE),
             (jeq, 0, 1, _SO_RCVBUFFORCE), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    # clone(): no new namespaces (flags are args[0]).
    prog += [(jeq, 0, 4, arch["clone"]), (ld_abs, 0, 0, 16), (jset, 0, 1, clone_new_mask), (ret, 0, 0, eperm),
             (ret, 0, 0, allow)]
    prog += [(ret, 0, 0, allow)]
    return prog


def _install_seccomp(libc) -> None:
    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = _seccomp_program()
    filters = (SockFilter * len(program))(*[SockFilter(*insn) for insn in program])
    fprog = SockFprog(len(program), filters)
    seccomp_mode_filter = 2
    _check(libc.prctl(PR_SET_SECCOMP, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0), "prctl(SET_SECCOMP)")


if __name__ == "__main__":
    _bootstrap_main(sys.argv[1:])
