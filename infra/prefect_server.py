"""Prefect API servers this project starts, each tied to the lifetime of the process that starts it.

- `start_server`: `prefect server start` (UI, services, its own PREFECT_HOME), for `cascade deploy`.
- `LocalAPI`: for the CLI commands that run flows (`cascade run`, `resume`, `regression-eval`) when no
  PREFECT_API_URL is configured: the same server Prefect would start itself (`SubprocessASGIServer`: uvicorn,
  no UI, ephemeral mode, the default database), but started by us. Prefect stops its own only from `atexit`,
  so a `kill -9` of the CLI left it running forever (ppid 1, ~200 MB each).

Every server is spawned with a parent-death signal (Linux prctl PR_SET_PDEATHSIG): the kernel SIGKILLs it
when the process that spawned it dies, however it dies. The signal fires when the spawning *thread* exits, so
servers are spawned from the main thread (the CLI's), which lives as long as the command. SIGKILL rather than
SIGTERM: nothing a server holds needs a clean shutdown (sqlite is transactional), and it cannot hang in one.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from cascade.artifacts.ports import free_port

SERVER_START_TIMEOUT_S = 120  # ~5 s idle; much longer on two busy cores
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def configured_api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


DEFAULT_UI_PORT = 4200  # Prefect's own default
PORT_FILE = "server.port"  # under PREFECT_HOME: the port the last local server listened on


def lasting_port(home: Path) -> int:
    """The port for a local server that links written earlier still reach: the last one's (PORT_FILE), else
    Prefect's default, else (taken by another process) a free one; remembered for the next start."""
    remembered = home / PORT_FILE
    try:
        candidates = [int(remembered.read_text().strip())]
    except (OSError, ValueError):
        candidates = []
    port = next((p for p in [*candidates, DEFAULT_UI_PORT] if port_is_free(p)), None) or free_port()
    home.mkdir(parents=True, exist_ok=True)
    remembered.write_text(f"{port}\n")
    return port


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _die_with_parent() -> Any:
    """A preexec_fn that makes the child get SIGKILL when this process dies (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("spawn servers from the main thread: PR_SET_PDEATHSIG fires when the spawning thread ends")
    prctl, parent = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()  # resolved before the fork

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died between fork and prctl: nobody would signal us
            os._exit(1)

    return preexec


def spawn(args: list[str], env: dict[str, str], out: IO[bytes] | None = None) -> subprocess.Popen:
    """A server process that dies with this one. Its own session: a Ctrl-C at the terminal reaches the
    command, which then stops the server itself."""
    return subprocess.Popen(
        args,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        start_new_session=True,
        preexec_fn=_die_with_parent(),
    )


def wait_healthy(api_url: str, process: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"prefect server exited with code {process.returncode} before it was healthy")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        time.sleep(0.2)
    raise RuntimeError(f"prefect server at {api_url} not healthy after {timeout:.0f} s")


def stop(process: subprocess.Popen, grace: float = 10) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(home: Path, port: int, log: Path) -> tuple[subprocess.Popen, str]:
    """`prefect server start` on 127.0.0.1:port with its own PREFECT_HOME (sqlite); returns (process, api url)."""
    home.mkdir(parents=True, exist_ok=True)
    # retryable errors logged: the UI does not retry a 503 (sqlite's "database is locked"), so its "Something went
    # wrong" toast is explained only by this log (docs/DEPLOYMENTS.md)
    env = dict(
        os.environ,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_API_URL=f"http://127.0.0.1:{port}/api",
        PREFECT_SERVER_LOG_RETRYABLE_ERRORS="true",
    )
    env.pop("PREFECT_API_URL", None)
    with open(log, "ab") as out:
        process = spawn(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)], env, out
        )
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        wait_healthy(api_url, process, SERVER_START_TIMEOUT_S)
    except BaseException:
        stop(process)
        raise
    return process, api_url


@contextlib.contextmanager
def serving(process: subprocess.Popen, api_url: str) -> Iterator[str]:
    """Point Prefect (this process's settings, and subprocesses through the environment) at a server started
    here; stop the server on exit."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    os.environ["PREFECT_API_URL"] = api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield api_url
    finally:
        os.environ.pop("PREFECT_API_URL", None)
        stop(process)


class LocalAPI:
    """The Prefect API of a CLI command: the configured one, else an ephemeral server spawned at construction,
    so that its start-up (~7 s) overlaps the imports that follow. Entering waits until it is healthy and
    points Prefect at it; leaving stops it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self._serving: contextlib.AbstractContextManager[str] | None = None
        if configured_api_url():
            return
        port = free_port()
        self.api_url = f"http://127.0.0.1:{port}/api"
        # The command line and environment of Prefect's SubprocessASGIServer, whose database and settings
        # this keeps; its errors go to the terminal, as Prefect's do.
        env = dict(os.environ, PREFECT_UI_ENABLED="0", PREFECT__SERVER_EPHEMERAL="1", PREFECT__SERVER_FINAL="1")
        self.process = spawn(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env,
        )

    @property
    def embedded(self) -> bool:
        """Whether this is the command's own server (no PREFECT_API_URL was configured)."""
        return self.process is not None

    def __enter__(self) -> LocalAPI:
        if self.process is not None:
            try:
                wait_healthy(self.api_url, self.process, SERVER_START_TIMEOUT_S)
            except BaseException:
                stop(self.process)
                raise
            self._serving = serving(self.process, self.api_url)
            self._serving.__enter__()
            from cascade.tasks.lifecycle import EPHEMERAL_API_ENV  # a run's tasks: only once one starts

            os.environ[EPHEMERAL_API_ENV] = "1"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._serving is not None:
            from cascade.tasks.lifecycle import EPHEMERAL_API_ENV

            os.environ.pop(EPHEMERAL_API_ENV, None)
            self._serving.__exit__(*exc)
