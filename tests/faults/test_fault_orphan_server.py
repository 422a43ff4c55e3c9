"""kill -9 of `cascade run` takes the Prefect server it started down with it.

Without a configured PREFECT_API_URL the CLI runs flows against a local uvicorn server; Prefect's own ephemeral
server is stopped only from `atexit`, which a SIGKILL skips, so it stayed up forever (ppid 1, ~200 MB).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.faults.conftest import QUIET, cascade

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    """Pids whose parent is pid (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped (a container's init may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def healthy_server_child(proc, timeout: float) -> int:
    """The pid of the CLI's uvicorn child once its API answers /health."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in children(proc.pid):
            port = re.search(r"uvicorn .*--port (\d+)", cmdline(pid))
            if port:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port[1]}/api/health", timeout=2):
                        return pid
                except OSError:
                    pass
        time.sleep(0.2)
    raise AssertionError(f"no healthy Prefect server child of the CLI (exit code {proc.poll()})")


def test_kill_9_of_the_cli_takes_its_prefect_server_down(tmp_path):
    env = dict(os.environ, **QUIET, CASCADE_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL", None)  # no configured API: the CLI needs a server of its own
    proc = cascade(["run", "micro"], env)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # a full pipe would block the CLI
    server = None
    try:
        server = healthy_server_child(proc, timeout=180)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 5
        while alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(server), f"server {server} outlived the CLI: {cmdline(server)}"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        if server is not None and alive(server):
            os.kill(server, signal.SIGKILL)
