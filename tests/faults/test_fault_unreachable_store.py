"""An S3 endpoint that cannot be reached fails the CLI fast: within 30 s, one line naming the endpoint, exit code
2, nothing written. Before, a listener that accepts and never answers held `cascade run` for about 20 minutes
(every request waited out its read timeout, under three layers of retries), and a refused port took 16 s and
printed a 400-line traceback.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.artifacts.servers import FAKE_KEYS, ROOT, free_port

BUDGET_S = 30


@contextlib.contextmanager
def silent_endpoint():
    """http://127.0.0.1:PORT of a listener that accepts connections and never sends a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: done
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


@contextlib.contextmanager
def refusing_endpoint():
    yield f"http://127.0.0.1:{free_port()}"  # nothing listens there


def run_cli(args: list[str], home: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CASCADE_"))}
    full.update(FAKE_KEYS, CASCADE_HOME=str(home), **env)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "cascade.flows.cli", *args], capture_output=True, text=True, env=full,
                            cwd=ROOT, timeout=120)
    return result, time.monotonic() - started


@pytest.mark.parametrize("endpoint", [silent_endpoint, refusing_endpoint], ids=["never-answers", "refused"])
@pytest.mark.parametrize("command", ["run", "status"])
def test_unreachable_s3_endpoint_fails_fast_with_one_line(tmp_path, endpoint, command):
    home = tmp_path / "home"
    with endpoint() as url:
        if command == "run":  # the endpoint from the recipe
            result, elapsed = run_cli(["run", "micro", "storage.root=s3://b/x", f"storage.endpoint_url={url}"], home)
        else:  # the endpoint from the environment
            result, elapsed = run_cli(["status", "--store", "s3://b/x"], home, AWS_ENDPOINT_URL=url)
    assert elapsed < BUDGET_S, f"{elapsed:.0f} s: {result.stderr[-2000:]}"
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith("cascade: error: S3 endpoint ") and url in lines[0], lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert not home.exists() or not any(p.is_file() for p in home.rglob("*"))
    print(f"{command} against a {endpoint.__name__}: {elapsed:.1f} s: {lines[0]}")


def test_a_write_to_an_endpoint_gone_silent_mid_run_gives_up(monkeypatch):
    """Later in a run (the endpoint answered once), a PUT to a server that stopped answering ends within its
    deadline and the retry budget. Before, aiohttp awaited the answer to `Expect: 100-continue` forever."""
    from cascade.artifacts import store as st
    from cascade.artifacts.config import StorageConfig

    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(st, "READ_TIMEOUT_S", 1)  # seconds, not minutes: the mechanism, not the defaults
    monkeypatch.setattr(st, "CONNECT_TIMEOUT_S", 1)
    with silent_endpoint() as url:
        store = st.Store.from_config(StorageConfig(root="s3://b/x", endpoint_url=url))
        store.retry = st.RetryPolicy(attempts=5, base=0.1, budget=3)
        monkeypatch.setattr(st, "_REACHED", {(url, "b")})  # as if it had answered at the start of the run
        started = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            store.write_bytes("runs/r/LEASE.json", b"{}")
        elapsed = time.monotonic() - started
    assert elapsed < st.body_deadline(2) + 3 + 1, elapsed
    assert "write s3://b/x/runs/r/LEASE.json failed after" in info.value.__notes__[0]
