"""The caller's side of the sandbox: the public API, and the supervisor of every run.

Probes once which isolation layers work here (strongest first), then per run: an unused uid, a cgroup,
a working directory holding the program, and the child (child.py run as a script) started in its own
session with a config naming all of it; reads its output through bounded readers, kills its process
group after the wall clock plus a grace, and turns the child's status report into a Verdict.  What the
layers provide and what they do not: the package docstring.  Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Literal

from cascade.sandbox import cgroup, child, seccomp
from cascade.sandbox.holdings import BoundedReader, UidPool, kill_group, remove_tree
from cascade.sandbox.reaping import wait_exit

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
_PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CHILD_SCRIPT = os.path.abspath(child.__file__)
_LAYER_ORDER = ("userns", "netns", "pidns", "mntns", "setuid", "seccomp", "cgroup", "rlimits", "socket-preamble")
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_BACKSTOP_GRACE = 5.0  # seconds the caller waits beyond wall_seconds before killing the group itself
_STATUS_MAX = 1 << 16


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
    filters = [("seccomp",), ()] if seccomp.supported() else [()]
    groups = [("cgroup",), ()] if cgroup.available() else [()]
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


_uids = UidPool(int(os.environ.get("CASCADE_SANDBOX_UID_BASE", "65000")))


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
            "seccomp": seccomp.filter_program() if "seccomp" in layers else [],
        }
        return _supervise(config, workdir, limits, start, mode, group)
    finally:
        if uid is not None:
            _uids.release(uid)
        if group is not None:
            group.remove()
        remove_tree(workdir)


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
    candidates = (
        [override]
        if override
        else [
            sys.executable,
            getattr(sys, "_base_executable", None),
            "/usr/bin/python3",
            "/usr/local/bin/python3",
        ]
    )
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
    argv = [sys.executable, "-I", "-S", "-B", _CHILD_SCRIPT, json.dumps(config)]
    try:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=_bootstrap_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,
        )
    except OSError as exc:
        os.close(status_r)
        os.close(status_w)
        return Verdict("error", None, "", f"could not start sandbox: {exc}", time.monotonic() - start, mode)
    os.close(status_w)
    readers = [BoundedReader(proc.stdout, limits.output_bytes), BoundedReader(proc.stderr, limits.output_bytes)]
    exited = wait_exit(proc.pid, limits.wall_seconds + _BACKSTOP_GRACE)
    if not exited and config["uid"] is not None and "pidns" not in config["layers"]:
        # Take the program's tree down first and give our init a moment to
        # reap it: orphans of a killed init would go to the host's init, which
        # in a container may never reap them.
        _kill_uid(config["uid"], config["python"])
        wait_exit(proc.pid, 2.0)
    # The bootstrap is still unreaped here, so its pid (= the group id) cannot
    # have been recycled: killing the group cannot hit an unrelated process.
    kill_group(proc.pid)
    proc.wait()
    report = _read_status(status_r)
    stdout, stderr = (reader.result(timeout=5.0) for reader in readers)
    seconds = time.monotonic() - start
    memory_exceeded = group is not None and group.memory_exceeded()
    status, returncode, note = _judge(report, exited, proc.returncode, limits, memory_exceeded)
    if note:
        stderr = stderr + ("\n" if stderr else "") + f"[sandbox] {note}"
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


def _kill_uid(uid: int, python: str) -> None:
    """Kill every process of the sandbox uid (only needed without a pid namespace).

    kill(-1) from a process running as that uid reaches exactly its processes,
    including any that left the process group with setsid()."""
    killer = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
    for _ in range(3):
        try:
            subprocess.run(
                [python, "-I", "-S", "-c", killer],
                user=uid,
                group=uid,
                extra_groups=[],
                env=_bootstrap_env(),
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            return
