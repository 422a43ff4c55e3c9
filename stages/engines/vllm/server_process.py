"""One launch of the managed vLLM server as a process: the leader of its own process group, logging to its own
file, watching for its parent's death (a trainer killed by SIGKILL runs no exit hook), and taken down group and
all. The lifecycle around it (restart, stop, readiness) is stages/engines/vllm/server.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

# Runs in the vLLM venv as the server's main process. The trainer may die by SIGKILL, which runs no atexit
# hook, so the server watches for being orphaned and then takes its whole process group down.
LAUNCHER = """
import os, runpy, signal, sys, threading, time
parent = int(sys.argv[1])
def orphan_watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)
threading.Thread(target=orphan_watch, daemon=True).start()
sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[2:]]
runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
"""


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc so psutil is not needed."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class ServerProcess:
    """One launch: the server process, leader of its own group, logging to its own file."""

    def __init__(self, cmd: list[str], env: dict[str, str], cwd: Path, log_path: Path, host: str, port: int):
        self.log_path, self.host, self.port = log_path, host, port
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pgid = self.proc.pid  # start_new_session makes the server its group's leader

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, grace: float = 5.0) -> None:
        """SIGTERM lets vLLM free its shared memory; SIGKILL follows for whatever is left of the group."""
        for sig, patience in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + patience
            while time.monotonic() < deadline:
                self.proc.poll()  # reap the leader, or it lingers as a zombie member of the group
                if not group_members(self.pgid):
                    return
                time.sleep(0.1)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
                return f.read().decode(errors="replace")
        except OSError as err:
            return f"(log unreadable: {err})"
