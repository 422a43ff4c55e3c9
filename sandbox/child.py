"""The sandbox's side, run as a script: bootstrap (B) -> init (I) -> the program (U).

The supervisor starts ``python -I -S -B child.py <config>`` in the host working directory that holds
main.py.  The config is one JSON object: layers, limits (SandboxLimits as a dict), uid (or null),
python, workdir (as the program sees it), hide (paths to cover), env (the program's whole environment),
cgroup_procs (files to write the program's pid to), seccomp (the filter's instructions, from
seccomp.py) and status_fd.  B enters the namespaces and forks I; I moves the held program into its
cgroup, sets up the mounts, releases U (rlimits, uid or capability drop, seccomp, exec), waits for it up
to the wall clock and kills whatever it left.  Each writes JSON lines on the status fd: I its verdict
({"kind": "exit", "code", "cpu"}, {"kind": "signal", "signal", "cpu"} or {"kind": "timeout", "cpu"}),
any of them {"kind": "error", "message"} when setup fails; the supervisor judges them.

Standard library only, and one sibling: under ``-I -S`` nothing of ours is on the path, so run as a script it
loads reaping.py (waiting for and killing processes, which the supervisor uses too) from its own folder, before
any mount hides anything.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource  # also needed by os.wait4, and must be loaded before /root is hidden
import signal
import sys

if __name__ == "__main__":  # its folder goes last on the path: no sibling can shadow a standard module
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    from reaping import kill_all_of_uid, kill_descendants, wait_exit
else:
    from cascade.sandbox.reaping import kill_all_of_uid, kill_descendants, wait_exit


CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_SECUREBITS = 22, 24, 28
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 36, 38
_MOUNT_OPTION_FLAGS = {
    "ro": MS_RDONLY,
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}


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
            kill_all_of_uid(int(config["uid"]))
        kill_descendants()
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
    timed_out = not wait_exit(pid, wall)
    if timed_out:
        os.kill(pid, signal.SIGKILL)  # still unreaped, so the pid is still ours
    _, status, usage = os.wait4(pid, 0)
    cpu = usage.ru_utime + usage.ru_stime
    if timed_out:
        return {"kind": "timeout", "cpu": cpu}
    if os.WIFSIGNALED(status):
        return {"kind": "signal", "signal": os.WTERMSIG(status), "cpu": cpu}
    return {"kind": "exit", "code": os.WEXITSTATUS(status), "cpu": cpu}


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
        _mount(
            libc,
            "tmpfs",
            "/dev/shm",
            "tmpfs",
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            f"size=16m,nr_inodes={inodes},mode=1777",
        )
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
            _install_seccomp(libc, config["seccomp"])
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


def _install_seccomp(libc, program: list[list[int]]) -> None:
    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(program))(*[SockFilter(*insn) for insn in program])
    fprog = SockFprog(len(program), filters)
    seccomp_mode_filter = 2
    _check(libc.prctl(PR_SET_SECCOMP, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0), "prctl(SET_SECCOMP)")


if __name__ == "__main__":
    _bootstrap_main(sys.argv[1:])
