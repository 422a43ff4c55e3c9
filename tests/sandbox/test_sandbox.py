"""Hostile-program tests for the sandbox package.

Every hostile program is written so that it exits 0 only if its attack worked;
the test then checks three things: the verdict is not "pass" (reward 0), the
attack left no trace on the host, and nothing of the sandbox is still running.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
import uuid

import pytest

from cascade.sandbox import SandboxLimits, Verdict, isolation_mode, run_many, run_python

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANDBOX_FILE = os.path.join(PROJECT_ROOT, "sandbox", "supervisor.py")
FAST = SandboxLimits(cpu_seconds=2, wall_seconds=4.0, memory_mb=256)
MODE = isolation_mode()
LAYERS = set(MODE.split("+"))
HAS_MNTNS = "mntns" in LAYERS
CONFINED_FS = HAS_MNTNS or "setuid" in LAYERS
# wall-clock limits and budgets, and host-wide checks (no process of a sandbox uid, no new cascade-sbx-* in /tmp)
# that another test's sandboxed programs running alongside would fail
pytestmark = pytest.mark.serial
NO_MNTNS = "this mode has no mount namespace: world-writable host dirs stay writable (documented)"


def _namespaces_available() -> bool:
    """Whether this machine lets root create the namespaces the sandbox wants."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount", "--mount-proc", "true"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return probe.returncode == 0


def _world_accessible(path: str, bits: int) -> bool:
    """Whether any uid may use ``path`` with ``bits`` (0o004 read, 0o005 read+exec)."""
    path = os.path.realpath(path)
    try:
        if os.stat(path).st_mode & bits != bits:
            return False
        while path != "/":
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def _proc_table() -> list[tuple[int, int, int, str, str]]:
    """(pid, ppid, uid, state, cmdline) for every host process."""
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                tail = fh.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
            uid = os.stat(f"/proc/{entry}").st_uid
        except (OSError, IndexError):
            continue
        rows.append((int(entry), int(tail[1]), uid, tail[0].decode(), cmdline))
    return rows


_children_before_test: set[int] = set()


@pytest.fixture(autouse=True)
def _remember_children():
    """Children this process already had (e.g. servers of other test modules' session fixtures) are not leftovers."""
    me = os.getpid()
    _children_before_test.clear()
    _children_before_test.update(pid for pid, ppid, *_ in _proc_table() if ppid == me)
    yield


def assert_host_clean(*markers: str) -> None:
    """No new child (zombie or not) of this test process, no process of a
    sandbox uid, and no process whose command line carries one of ``markers``."""
    me = os.getpid()
    for pid, ppid, uid, state, cmdline in _proc_table():
        assert ppid != me or pid in _children_before_test, f"left-over child {pid} ({state}): {cmdline!r}"
        assert not 65000 <= uid < 65512, f"sandbox-uid process {pid} survived: {cmdline!r}"
        for marker in markers:
            assert marker not in cmdline, f"process {pid} survived: {cmdline!r}"


def hostile(code: str, limits: SandboxLimits = FAST, *markers: str) -> Verdict:
    verdict = run_python(textwrap.dedent(code), limits)
    assert verdict.isolation == MODE
    assert not verdict.passed, f"hostile program got reward: {verdict}"
    assert verdict.status != "pass"
    assert_host_clean(*markers)
    return verdict


# ---------------------------------------------------------------- positive


@pytest.mark.timeout(60)
def test_correct_program_passes():
    code = """
    def add(a, b):
        return a + b
    assert add(2, 3) == 5
    print("ok ✓")
    """
    verdict = run_python(textwrap.dedent(code))
    assert verdict.status == "pass" and verdict.passed, verdict
    assert verdict.returncode == 0
    assert verdict.stdout == "ok ✓\n"
    assert verdict.isolation == isolation_mode()
    assert 0 < verdict.seconds < 10
    assert_host_clean()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "code, returncode, needle",
    [
        ("assert 1 + 1 == 3, 'wrong'\n", 1, "AssertionError: wrong"),
        ("def broken(:\n", 1, "SyntaxError"),
        ("import sys\nsys.exit(3)\n", 3, ""),
        ("input()\n", 1, "EOFError"),  # stdin is empty, not the caller's terminal
    ],
)
def test_failing_program_fails(code, returncode, needle):
    verdict = run_python(code, FAST)
    assert verdict.status == "fail" and not verdict.passed, verdict
    assert verdict.returncode == returncode
    assert needle in verdict.stderr


@pytest.mark.timeout(60)
def test_fresh_working_directory_is_writable_and_removed():
    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("cascade-sbx-")}
    code = """
    import os, tempfile
    assert os.listdir(".") == ["main.py"], os.listdir(".")
    with open("scratch.txt", "w") as fh:
        fh.write("hello")
    with tempfile.NamedTemporaryFile() as tmp:
        assert tmp.name.startswith(os.getcwd())
    assert open("scratch.txt").read() == "hello"
    assert os.environ["HOME"] == os.getcwd()
    print(os.getcwd())
    """
    verdict = run_python(textwrap.dedent(code), FAST)
    assert verdict.status == "pass", verdict
    inside = verdict.stdout.strip()
    assert os.path.basename(inside).startswith("cascade-sbx-")
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), os.path.basename(inside)))
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("cascade-sbx-")}
    assert after == before


@pytest.mark.timeout(60)
def test_run_many_preserves_order():
    programs = [f"import time\ntime.sleep({(4 - i) * 0.15})\nprint({i})\n" for i in range(5)]
    programs.append("raise SystemExit(7)\n")
    verdicts = run_many(programs, FAST, max_workers=2)
    assert [v.stdout.strip() for v in verdicts[:5]] == ["0", "1", "2", "3", "4"]
    assert all(v.passed for v in verdicts[:5])
    assert verdicts[5].status == "fail" and verdicts[5].returncode == 7
    assert run_many([], FAST) == []
    assert_host_clean()


@pytest.mark.timeout(60)
def test_run_many_runs_in_parallel_but_bounded():
    programs = ["import time\ntime.sleep(1)\n"] * 4
    start = time.monotonic()
    verdicts = run_many(programs, FAST, max_workers=2)
    elapsed = time.monotonic() - start
    assert all(v.passed for v in verdicts), verdicts
    assert elapsed < 3.5, f"not parallel: {elapsed:.2f}s"
    assert elapsed >= 1.9, f"max_workers=2 not respected: {elapsed:.2f}s"


@pytest.mark.timeout(60)
def test_reports_isolation_and_it_is_the_strongest_available(record_property):
    record_property("isolation", MODE)
    print(f"\nsandbox isolation on this machine: {MODE}")
    assert run_python("pass\n", FAST).isolation == MODE
    assert "rlimits" in LAYERS
    # Some network barrier that works below Python must be present...
    assert LAYERS & {"netns", "seccomp"}, MODE
    # ...and where the machine allows it, the strong mode must have been chosen
    # (a silent downgrade would be a bug).
    if _namespaces_available():
        assert {"netns", "pidns", "mntns", "setuid"} <= LAYERS, MODE
    if os.geteuid() == 0:
        assert "setuid" in LAYERS, "root must drop privileges: RLIMIT_NPROC is ignored for root"


# ---------------------------------------------------------------- CPU / time


@pytest.mark.timeout(60)
def test_infinite_loop_hits_cpu_limit():
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=8.0)
    verdict = hostile("while True:\n    pass\n", limits)
    assert verdict.status == "timeout"
    assert verdict.seconds < 5, "CPU limit, not the wall clock, should have stopped it"


@pytest.mark.timeout(60)
def test_busy_cpu_threads_and_children_hit_limits():
    code = """
    import os, threading
    def spin():
        while True:
            pass
    for _ in range(3):
        threading.Thread(target=spin, daemon=True).start()
    for _ in range(3):
        if os.fork() == 0:
            spin()
    spin()
    """
    verdict = hostile(code, SandboxLimits(cpu_seconds=1, wall_seconds=6.0))
    assert verdict.status == "timeout"
    assert verdict.seconds < 6.0 + 2


@pytest.mark.timeout(60)
def test_sleeping_forever_hits_wall_limit():
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=1.5)
    verdict = hostile("import time\ntime.sleep(10**6)\n", limits)
    assert verdict.status == "timeout" and verdict.returncode is None
    assert 1.4 <= verdict.seconds < 1.5 + 2.5


# ---------------------------------------------------------------- processes


@pytest.mark.timeout(60)
def test_process_limit_is_enforced():
    code = """
    import os, sys, time
    count = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        count += 1
    print(count)
    sys.exit(0 if count >= 200 else 1)
    """
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=6.0, memory_mb=256, max_processes=16)
    verdict = hostile(code, limits)
    assert verdict.status == "fail", verdict
    assert int(verdict.stdout) < 16


@pytest.mark.timeout(60)
def test_fork_bomb_is_contained_and_host_can_still_fork():
    code = """
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
    """
    hostile(code, SandboxLimits(cpu_seconds=1, wall_seconds=3.0, memory_mb=256))
    assert subprocess.run(["true"]).returncode == 0
    assert run_python("print('alive')\n", FAST).stdout == "alive\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("exit_code", [3, 0])
def test_background_children_do_not_outlive_the_program(exit_code):
    marks = [f"{31000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}" for _ in range(2)]
    code = f"""
    import os, subprocess, sys, time
    subprocess.Popen(["sleep", "{marks[0]}"], start_new_session=True)
    if os.fork() == 0:          # classic daemon: setsid + double fork
        os.setsid()
        if os.fork() == 0:
            os.execvp("sleep", ["sleep", "{marks[1]}"])
        os._exit(0)
    time.sleep(0.3)
    sys.exit({exit_code})
    """
    if exit_code:
        hostile(code, FAST, *marks)
    else:  # even a passing program loses its background processes
        verdict = run_python(textwrap.dedent(code), FAST)
        assert verdict.passed, verdict
        assert_host_clean(*marks)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "attack",
    [
        "os.kill(os.getppid(), signal.SIGKILL)",
        "os.kill(CALLER, signal.SIGKILL)",
        "os.killpg(os.getpgid(0), signal.SIGKILL)",
        "os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)",
        "os.killpg(os.getpgid(CALLER), signal.SIGKILL)",
        "os.kill(-1, signal.SIGKILL)",
    ],
)
def test_program_cannot_kill_its_parent_or_caller(attack):
    canary = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        code = f"""
        import os, signal, sys, time
        CALLER = {os.getpid()}
        parent = os.getppid()
        {attack}
        time.sleep(0.3)
        try:
            os.kill(parent, 0)
            gone = os.getppid() != parent  # re-parented: the parent died
        except ProcessLookupError:
            gone = True
        except PermissionError:  # exists, just not ours to signal
            gone = False
        print("parent gone" if gone else "parent alive")
        sys.exit(0 if gone else 1)
        """
        verdict = run_python(textwrap.dedent(code), FAST)
        assert not verdict.passed, verdict
        assert canary.poll() is None, "an unrelated host process was killed"
    finally:
        canary.kill()
        canary.wait()
    assert_host_clean()
    # The supervisor chain itself survived: a normal program still runs.
    assert run_python("print(1)\n", FAST).stdout == "1\n"


# ---------------------------------------------------------------- memory / files / output


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(64 * 1024**3)\n",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024**2))\n",
    ],
)
def test_memory_bomb_is_stopped(code):
    verdict = hostile(code, SandboxLimits(cpu_seconds=5, wall_seconds=8.0, memory_mb=256))
    assert "MemoryError" in verdict.stderr or verdict.status in ("error", "timeout")
    assert verdict.seconds < 8


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "code, statuses",
    [
        # Default limit: a clean RecursionError.
        ("def f(n):\n    return f(n + 1) + 1\nf(0)\n", {"fail"}),
        # Limit lifted: frames pile up until memory, CPU or the C stack runs out.
        (
            "import sys\nsys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)\n",
            {"fail", "error", "timeout"},
        ),
        # C-level recursion through repr() of a deeply nested list.
        (
            "import sys\nsys.setrecursionlimit(10**8)\nx = []\nfor _ in range(10**6):\n    x = [x]\nrepr(x)\n",
            {"fail", "error", "timeout"},
        ),
    ],
)
def test_deep_recursion(code, statuses):
    verdict = hostile(code, SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_mb=256))
    assert verdict.status in statuses, verdict


@pytest.mark.timeout(60)
def test_file_size_bomb():
    code = """
    with open("big.bin", "wb") as fh:
        for _ in range(256):
            fh.write(b"x" * 2**20)
    """
    verdict = hostile(code, SandboxLimits(cpu_seconds=5, wall_seconds=8.0, file_size_mb=4))
    assert verdict.status == "fail"
    assert "File too large" in verdict.stderr or "No space left" in verdict.stderr


@pytest.mark.timeout(60)
def test_fd_exhaustion():
    code = "files = []\nwhile True:\n    files.append(open('main.py'))\n"
    verdict = hostile(code, SandboxLimits(open_files=32))
    assert verdict.status == "fail"
    assert "Too many open files" in verdict.stderr


@pytest.mark.timeout(60)
def test_endless_output_is_truncated_and_parent_memory_stays_bounded():
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = """
    import sys
    line = "x" * 65536
    while True:
        sys.stdout.write(line)
        sys.stderr.write(line)
    """
    verdict = hostile(code, SandboxLimits(cpu_seconds=10, wall_seconds=2.0, output_bytes=1000))
    assert verdict.status == "timeout"
    assert verdict.stdout == "x" * 1000
    program_stderr, _, note = verdict.stderr.partition("\n[sandbox] ")
    assert program_stderr == "x" * 1000 and "wall time" in note
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 64, f"parent grew by {grown_mb:.0f} MiB"


@pytest.mark.timeout(60)
def test_large_finite_output_is_truncated():
    code = "import sys\nfor _ in range(800):\n    sys.stdout.write('y' * 65536)\n"  # 50 MiB
    verdict = run_python(code, SandboxLimits(wall_seconds=8.0, output_bytes=4096))
    assert verdict.passed, verdict.stderr
    assert verdict.stdout == "y" * 4096


MEMORY_ESCAPES = {
    # Pages of a memfd are not in the address space, so RLIMIT_AS does not count them.
    "memfd": """
        import os, sys
        chunk = b"x" * 2**24
        for i in range(40):
            try:
                os.write(os.memfd_create("hoard"), chunk)
            except OSError as exc:
                print(i * 16, "MiB held;", exc)
                sys.exit(1)
        print(40 * 16, "MiB held")
    """,
    # The same through a SysV segment: filled while attached, kept after shmdt().
    "sysv-shm": """
        import ctypes, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype, libc.shmat.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmdt.argtypes = [ctypes.c_void_p]
        for i in range(40):
            segment = libc.shmget(0, 2**24, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if segment < 0:
                print(i * 16, "MiB held; shmget errno", ctypes.get_errno())
                sys.exit(1)
            addr = libc.shmat(segment, None, 0)
            ctypes.memset(addr, 1, 2**24)
            libc.shmdt(addr)
        print(40 * 16, "MiB held")
    """,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack", sorted(MEMORY_ESCAPES))
def test_memory_outside_the_address_space_is_denied(attack):
    verdict = hostile(MEMORY_ESCAPES[attack], SandboxLimits(cpu_seconds=5, wall_seconds=8.0, memory_mb=128))
    assert verdict.status == "fail", verdict
    assert verdict.stdout.startswith("0 MiB held"), verdict.stdout  # not a page of host memory was taken


@pytest.mark.timeout(60)
def test_sysv_queues_and_semaphores_are_denied():
    # Kernel memory as well (32k queues of 16 KiB each by default), and without an IPC namespace they outlive the run.
    code = """
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    made = {"msgget": libc.msgget(0, 0o1600), "semget": libc.semget(0, 1, 0o1600)}  # IPC_PRIVATE, IPC_CREAT | 0600
    print(made)
    sys.exit(0 if max(made.values()) >= 0 else 1)
    """
    verdict = hostile(code)
    assert verdict.status == "fail", verdict


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", [".", "/dev/shm"])
def test_inode_flood_stops_at_the_tmpfs_bound(where):
    if not HAS_MNTNS:
        pytest.skip("without a mount namespace the working directory is on the host's /tmp (documented)")
    # Empty files take no tmpfs blocks but ~1 KiB of kernel memory each: only nr_inodes bounds them.
    code = f"""
    import os, sys
    for made in range(50_000):
        try:
            os.close(os.open(os.path.join({where!r}, f"f{{made}}"), os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            print(made, exc.strerror)
            sys.exit(1)
    print(made + 1, "files")
    """
    verdict = hostile(code, SandboxLimits(cpu_seconds=5, wall_seconds=8.0))
    made, reason = verdict.stdout.split(maxsplit=1)
    assert int(made) <= SandboxLimits().max_inodes and reason.strip() == "No space left on device", verdict


# A program holding kernel memory in socket buffers: exits 0 if it held ``target_mib`` MiB, which RLIMIT_AS never sees.
SOCKET_HOARD = """
import socket, sys
target = {target_mib} * 2**20
held, pairs, refused = 0, [], False
try:
    while held < target:
        pairs.append(socket.socketpair())
        for end in pairs[-1]:
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                try:
                    end.setsockopt(socket.SOL_SOCKET, option, 2**30)
                except PermissionError:
                    refused = True  # the default buffer still holds some
            end.setblocking(False)
            try:
                while held < target:
                    held += end.send(b"x" * 65536)
            except BlockingIOError:
                pass
except OSError as exc:
    print("stopped:", exc.strerror)
print("buffer size refused" if refused else "buffer size raised")
print(held >> 20, "MiB held in socket buffers")
sys.exit(0 if held >= target else 1)
"""

# 16 children, each holding 24 MiB at the same time: exits 0 if all 16 did.
CHILDREN_HOARD = """
import os, sys, time
r, w = os.pipe()
for _ in range(16):
    if os.fork() == 0:
        os.close(r)
        held = b"x" * (24 * 2**20)  # written, so every page is resident
        os.write(w, b"+")
        time.sleep(2)
        os._exit(0)
os.close(w)
got = b""
while chunk := os.read(r, 16):
    got += chunk
print(len(got) * 24, "MiB held at once by", len(got), "children")
sys.exit(0 if len(got) == 16 else 1)
"""

NEEDS_CGROUP = pytest.mark.skipif(
    "cgroup" not in LAYERS, reason="no writable cgroup memory controller: memory is limited per process (documented)"
)


def _memory_cgroup_writable() -> bool:
    """Whether root may create memory cgroups here (a v1 mount, as on the machines this was built on)."""
    path = "/sys/fs/cgroup/memory"
    return os.geteuid() == 0 and os.path.isdir(path) and not os.statvfs(path).f_flag & os.ST_RDONLY


def test_the_cgroup_layer_runs_where_a_memory_controller_is_writable():
    if _memory_cgroup_writable():
        assert "cgroup" in LAYERS, MODE


@NEEDS_CGROUP
@pytest.mark.timeout(60)
def test_socket_buffers_count_against_memory_mb():
    # Enough descriptors that even default-size buffers reach twice memory_mb.
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=10.0, memory_mb=128, open_files=4096)
    verdict = hostile(SOCKET_HOARD.format(target_mib=256), limits)
    assert verdict.status == "fail" and "memory limit of 128 MB exceeded" in verdict.stderr, verdict


@NEEDS_CGROUP
@pytest.mark.timeout(60)
def test_children_together_are_held_to_memory_mb():
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=10.0, memory_mb=64)
    verdict = hostile(CHILDREN_HOARD, limits)
    assert verdict.status == "fail" and "memory limit of 64 MB exceeded" in verdict.stderr, verdict


@NEEDS_CGROUP
@pytest.mark.timeout(60)
def test_run_cgroups_are_removed_and_a_dead_callers_are_cleaned_at_start(monkeypatch):
    from cascade.sandbox import cgroup

    parents = [h.parent for h in cgroup._hierarchies()]
    ours = lambda: [n for p in parents for n in os.listdir(p) if n.startswith(f"{os.getpid()}-")]  # noqa: E731
    assert run_python("pass\n", FAST).passed
    assert ours() == []
    dead = subprocess.Popen(["true"])
    dead.wait()
    for parent in parents:  # what a caller killed mid-run leaves behind
        os.mkdir(os.path.join(parent, f"{dead.pid}-0"))
    monkeypatch.setattr(cgroup, "_found", None)
    assert cgroup.available()
    assert not any(os.path.exists(os.path.join(p, f"{dead.pid}-0")) for p in parents)


@pytest.mark.parametrize("handed_down, expected", [("cpu io memory pids", {"memory", "pids"}), ("cpu io", set())])
def test_a_cgroup_v2_hierarchy_is_used_where_the_callers_cgroup_hands_memory_down(
    tmp_path, monkeypatch, handed_down, expected
):
    """No v2 memory controller on the machines this was built on: the discovery is checked on a fake hierarchy."""
    from cascade.sandbox import cgroup

    own = tmp_path / "unified" / "user.slice" / "caller.scope"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text(handed_down + "\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 25 0:26 / {tmp_path / 'unified'} rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n")
    own_cgroups = tmp_path / "cgroup"
    own_cgroups.write_text("0::/user.slice/caller.scope\n")
    monkeypatch.setattr(cgroup, "_MOUNTINFO", str(mountinfo))
    monkeypatch.setattr(cgroup, "_OWN_CGROUPS", str(own_cgroups))
    found = cgroup._candidates()
    assert {c for h in found for c in h.controllers} == expected
    assert all(h.version == 2 and h.parent == str(own / "cascade-sandbox") for h in found)


@pytest.mark.timeout(90)
def test_without_a_writable_cgroup_one_warning_and_socket_buffers_stay_small(tmp_path, monkeypatch, caplog):
    if "seccomp" not in LAYERS:
        pytest.skip("the socket-buffer cap is part of the seccomp filter")
    from cascade.sandbox import cgroup, supervisor

    no_cgroup_mounts = tmp_path / "mountinfo"
    no_cgroup_mounts.write_text("")
    monkeypatch.setattr(cgroup, "_MOUNTINFO", str(no_cgroup_mounts))
    monkeypatch.setattr(cgroup, "_found", None)
    monkeypatch.setattr(supervisor, "_mode_layers", None)
    caplog.set_level("WARNING", logger="cascade.sandbox")
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=8.0, memory_mb=128)
    verdicts = [run_python(SOCKET_HOARD.format(target_mib=128), limits) for _ in range(2)]
    warnings = [r.getMessage() for r in caplog.records if "cgroup" in r.getMessage()]
    assert len(warnings) == 1 and "no writable cgroup memory controller" in warnings[0], warnings
    for verdict in verdicts:
        assert "cgroup" not in verdict.isolation and verdict.status == "fail", verdict
        refused, held = verdict.stdout.splitlines()[-2:]
        assert refused == "buffer size refused" and int(held.split()[0]) < 32, verdict.stdout
    assert_host_clean()


# ---------------------------------------------------------------- filesystem


def _outside_targets(tmp_path):
    tag = uuid.uuid4().hex
    return {
        "test-tmp_path": (str(tmp_path / "pwned.txt"), CONFINED_FS),
        "tmp": (f"/tmp/pwned-{tag}", HAS_MNTNS),
        "var-tmp": (f"/var/tmp/pwned-{tag}", HAS_MNTNS),
        "parent-of-cwd": (f"../pwned-{tag}", HAS_MNTNS),
        "project": (os.path.join(PROJECT_ROOT, f"pwned-{tag}"), CONFINED_FS),
        "etc": (f"/etc/pwned-{tag}", CONFINED_FS),
        "root-home": (f"/root/pwned-{tag}", CONFINED_FS),
    }


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["test-tmp_path", "tmp", "var-tmp", "parent-of-cwd", "project", "etc", "root-home"])
def test_write_outside_workdir_fails(tmp_path, where):
    path, guaranteed = _outside_targets(tmp_path)[where]
    if not guaranteed:
        pytest.skip(NO_MNTNS)
    host_path = os.path.normpath(os.path.join(tempfile.gettempdir(), path)) if path.startswith("..") else path
    code = f"""
    import os
    path = {path!r}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("pwned")
    """
    try:
        hostile(code)
        assert not os.path.exists(host_path)
    finally:
        if os.path.exists(host_path):
            os.unlink(host_path)


@pytest.mark.timeout(60)
def test_secret_files_are_unreadable(tmp_path):
    secret = tmp_path / "secrets.env"
    token = f"hunter2-{uuid.uuid4().hex}"
    secret.write_text(f"DB_PASSWORD={token}\n")
    secret.chmod(0o600)
    targets = ["/etc/shadow", str(secret), "/root"]
    if HAS_MNTNS:
        targets.append(SANDBOX_FILE)  # the project checkout is hidden entirely
    code = f"""
    import os, sys
    got = []
    for path in {targets!r}:
        try:
            got.append(os.listdir(path) if os.path.isdir(path) else open(path).read())
            print(path, "READ:" if got[-1] else "empty:", got[-1])
        except OSError as exc:
            print(path, "blocked:", exc)
    sys.exit(0 if any(got) else 1)
    """
    verdict = hostile(code)
    assert token not in verdict.stdout + verdict.stderr
    assert "READ" not in verdict.stdout
    assert "root:" not in verdict.stdout


@pytest.mark.timeout(60)
def test_environment_secrets_do_not_leak(monkeypatch):
    fake = f"AKIAFAKE{uuid.uuid4().hex}"
    for name in ("AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD"):
        monkeypatch.setenv(name, fake)
    code = f"""
    import os, sys
    seen = repr(dict(os.environ))
    for pid in ("self", "1", str(os.getppid()), "{os.getpid()}"):
        try:
            seen += open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
        except OSError as exc:
            seen += f" [{{pid}}: {{exc}}]"
    print(seen)
    sys.exit(0 if "AKIAFAKE" in seen else 1)
    """
    verdict = hostile(code)
    assert fake not in verdict.stdout + verdict.stderr
    assert "AWS_" not in verdict.stdout and "TOKEN" not in verdict.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "attack, needs",
    [
        ("os.setuid(0)", "setuid"),
        ("assert subprocess.run(['unshare', '-r', 'true']).returncode == 0", "seccomp"),
        ("assert subprocess.run(['mount', '-t', 'tmpfs', 'none', os.getcwd()]).returncode == 0", "setuid"),
    ],
)
def test_privilege_escalation_fails(attack, needs):
    if needs not in LAYERS:
        pytest.skip(f"mode {MODE} has no {needs} layer")
    hostile(f"import os, subprocess\n{attack}\n")


# ---------------------------------------------------------------- network


@pytest.fixture
def listener():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    yield srv
    srv.close()


def _assert_no_connection(srv: socket.socket) -> None:
    with pytest.raises((socket.timeout, BlockingIOError)):
        conn, _ = srv.accept()
        conn.close()


NETWORK_ATTACKS = {
    "socket-module": """
        import socket
        s = socket.create_connection(("127.0.0.1", PORT), timeout=2)
        s.sendall(b"exfiltrated")
    """,
    # Bypasses any Python-level patching: talks to libc directly.
    "raw-ctypes": """
        import ctypes, struct, sys
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.socket(2, 1, 0)
        if fd < 0:
            sys.exit(f"socket blocked, errno {ctypes.get_errno()}")
        addr = struct.pack("=H", 2) + struct.pack("!H", PORT) + bytes([127, 0, 0, 1]) + bytes(8)
        rc = libc.connect(fd, addr, 16)
        sys.exit(0 if rc == 0 else f"connect blocked, errno {ctypes.get_errno()}")
    """,
    # A subprocess never sees a Python-level preamble.
    "subprocess": """
        import subprocess, sys
        child = "import socket; socket.create_connection(('127.0.0.1', PORT), timeout=2)"
        sys.exit(subprocess.run([sys.executable, "-c", child.replace("PORT", str(PORT))]).returncode)
    """,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack", sorted(NETWORK_ATTACKS))
def test_network_is_unreachable_whatever_the_mode(listener, attack):
    port = listener.getsockname()[1]
    code = f"PORT = {port}\n" + textwrap.dedent(NETWORK_ATTACKS[attack])
    verdict = hostile(code)
    assert verdict.status == "fail", verdict
    _assert_no_connection(listener)


def _unhidden_dir() -> str:
    """A fresh world-searchable directory that the sandbox does not hide, like a host service's socket directory."""
    for parent in ("/var/lib", "/srv", "/opt", "/mnt"):
        if os.path.isdir(parent) and os.access(parent, os.W_OK) and _world_accessible(parent, 0o005):
            path = tempfile.mkdtemp(prefix="cascade-sbx-sock-", dir=parent)
            os.chmod(path, 0o755)
            return path
    pytest.skip("no writable, world-searchable directory outside the hidden paths")


@pytest.fixture
def unix_services():
    """Host services any uid may talk to: a stream and a datagram socket file (mode 777, as /dev/log or a
    carelessly chmod-ed docker.sock), and a stream socket in the abstract namespace."""
    where = _unhidden_dir()
    addresses = {
        "STREAM": os.path.join(where, "stream.sock"),
        "DGRAM": os.path.join(where, "dgram.sock"),
        "ABSTRACT": f"\0cascade-sbx-{uuid.uuid4().hex}",
    }
    servers = []
    try:
        for name, kind in (
            ("STREAM", socket.SOCK_STREAM),
            ("DGRAM", socket.SOCK_DGRAM),
            ("ABSTRACT", socket.SOCK_STREAM),
        ):
            srv = socket.socket(socket.AF_UNIX, kind)
            servers.append(srv)
            srv.bind(addresses[name])
            if kind == socket.SOCK_STREAM:
                srv.listen(8)
            if name != "ABSTRACT":
                os.chmod(addresses[name], 0o777)
            srv.setblocking(False)
        yield addresses, servers
    finally:
        for srv in servers:
            srv.close()
        shutil.rmtree(where)


def _received(servers: list[socket.socket]) -> bytes:
    got = b""
    for srv in servers:
        try:
            if srv.type == socket.SOCK_DGRAM:
                got += srv.recv(4096)
            else:
                conn, _ = srv.accept()
                conn.settimeout(1.0)
                got += b"<connected>" + conn.recv(4096)
                conn.close()
        except (TimeoutError, BlockingIOError):
            continue
    return got


UNIX_ATTACKS = {
    "path-connect": """
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(STREAM)
        s.sendall(b"exfiltrated")
    """,
    "abstract-connect": """
        import socket
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(ABSTRACT)
        s.sendall(b"exfiltrated")
    """,
    # A datagram pair is made without socket(), and can still address any socket file.
    "socketpair-sendto": """
        import socket
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.sendto(b"exfiltrated", DGRAM)
    """,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attack", sorted(UNIX_ATTACKS))
def test_unix_sockets_of_the_host_are_unreachable(unix_services, attack):
    addresses, servers = unix_services
    code = "".join(f"{name} = {address!r}\n" for name, address in addresses.items())
    verdict = hostile(code + textwrap.dedent(UNIX_ATTACKS[attack]))
    assert verdict.status == "fail", verdict
    assert _received(servers) == b""


@pytest.mark.timeout(60)
def test_local_ipc_still_works():
    """What the standard library builds on socketpair() and pipes keeps working: asyncio, multiprocessing."""
    code = """
    import asyncio, multiprocessing, socket
    a, b = socket.socketpair()
    a.sendall(b"ping")
    assert b.recv(4) == b"ping"
    async def double(x):
        await asyncio.sleep(0.01)
        return 2 * x
    async def main():
        return await asyncio.gather(*(double(i) for i in range(3)))
    assert asyncio.run(main()) == [0, 2, 4]
    with multiprocessing.Pool(2) as pool:
        assert pool.map(abs, [-1, -2, 3]) == [1, 2, 3]
    print("ok")
    """
    verdict = run_python(textwrap.dedent(code), SandboxLimits(cpu_seconds=5, wall_seconds=10.0))
    assert verdict.passed and verdict.stdout == "ok\n", verdict
    assert_host_clean()


@pytest.mark.timeout(60)
def test_socket_preamble_mode_blocks_new_sockets_but_not_local_ipc():
    """The last-resort mode (neither netns nor seccomp) is never chosen where those work: run it directly."""
    from cascade.sandbox.supervisor import _execute

    layers = ("setuid", "rlimits", "socket-preamble") if os.geteuid() == 0 else ("rlimits", "socket-preamble")
    for family in ("AF_UNIX", "AF_INET"):
        blocked = _execute(f"import socket\nsocket.socket(socket.{family})\n", FAST, layers)
        assert blocked.status == "fail" and "sockets disabled by sandbox" in blocked.stderr, blocked
    local = _execute("import asyncio, socket\nsocket.socketpair()\nasyncio.run(asyncio.sleep(0))\n", FAST, layers)
    assert local.passed, local
    assert_host_clean()


# ---------------------------------------------------------------- non-root callers


@pytest.mark.timeout(60)
def test_non_root_caller_is_also_contained(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to impersonate an unprivileged caller")
    python = "/usr/bin/python3"
    if not (_world_accessible(python, 0o005) and _world_accessible(SANDBOX_FILE, 0o004)):
        pytest.skip("no system python / readable checkout to run as an unprivileged user")
    victim = tempfile.mkdtemp(prefix="cascade-victim-")
    os.chown(victim, 65534, 65534)
    driver = f"""
    import sys
    sys.path.insert(0, {PROJECT_ROOT!r})
    from cascade import sandbox as sbx
    attack = "open({victim + "/pwned"!r}, 'w').write('x')"
    v = sbx.run_python(attack, sbx.SandboxLimits(wall_seconds=4))
    print(sbx.isolation_mode(), v.status, sep="\\n")
    """
    try:
        result = subprocess.run(
            [python, "-I", "-c", textwrap.dedent(driver)],
            user=65534,
            group=65534,
            extra_groups=[],
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": victim},
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert result.returncode == 0, result.stderr
        mode, status = result.stdout.split()
        print(f"\nisolation for a non-root caller: {mode}")
        assert "rlimits" in mode and ("netns" in mode or "seccomp" in mode)
        written = os.path.exists(os.path.join(victim, "pwned"))
    finally:
        shutil.rmtree(victim, ignore_errors=True)
    assert_host_clean()
    if "mntns" not in mode:
        pytest.skip(f"non-root mode {mode} cannot protect the caller's own files (documented)")
    assert status != "pass" and not written
