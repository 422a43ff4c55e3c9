"""Fault-injection fixtures: real S3 servers (moto; s3rver where data must survive a restart), a shared Prefect
server for CLI subprocesses (one ~5 s start instead of ~7 s of ephemeral start-up per subprocess), and helpers
to run the `cascade` CLI and check a store."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cascade.artifacts.checkpoint import MANIFEST, verify
from cascade.artifacts.store import Store
from tests.artifacts.servers import FAKE_KEYS, ROOT, free_port, make_bucket, mlflow_server, moto_server

KILL_RECIPE = Path(__file__).with_name("kill.yaml")
# Subprocesses share 2 cores: one torch thread each keeps them from oversubscribing (and results bitwise stable).
QUIET = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
}


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A moto S3 server for the test session."""
    os.environ.update({k: os.environ.get(k, v) for k, v in FAKE_KEYS.items()})
    server = moto_server(tmp_path_factory.mktemp("moto")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlflow_url(s3, tmp_path_factory):
    """An MLflow tracking server (sqlite backend) whose artifacts go to the moto S3 server, bucket mlflow-art."""
    make_bucket(s3.url, "mlflow-art")
    server = mlflow_server(tmp_path_factory.mktemp("mlflow"), s3.url, "mlflow-art").start()
    yield server.url
    server.stop()


def new_bucket(endpoint: str) -> str:
    bucket = f"fault-{secrets.token_hex(5)}"
    make_bucket(endpoint, bucket)
    return bucket


def cli_env(home: Path, endpoint: str, prefect_api: str | None, **extra: str) -> dict[str, str]:
    """The CLI's environment; TMPDIR under home, since a process killed with -9 leaves its stage's scratch dir."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        **QUIET,
        **FAKE_KEYS,
        CASCADE_HOME=str(home),
        AWS_ENDPOINT_URL=endpoint,
        TMPDIR=str(home / "tmp"),
        **extra,
    )
    if prefect_api:
        env["PREFECT_API_URL"] = prefect_api
    return env


def cascade(args: list[str], env: dict[str, str], module: str = "cascade.flows.cli") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_cli(args: list[str], home: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """`cascade ARGS` to completion (at most 120 s) with only fake AWS keys of this environment's AWS_ and CASCADE_
    settings; (result, seconds)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "CASCADE_"))}
    full.update(FAKE_KEYS, CASCADE_HOME=str(home), **env)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "cascade.flows.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=ROOT,
        timeout=120,
    )
    return result, time.monotonic() - started


Misbehaviour = Callable[[socket.socket, threading.Event], None]
HTTP_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def read_request(conn: socket.socket) -> bool:
    """Read one request's head (the store's requests here have no body); False when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    return True


def stall(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()


def not_http(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01 not HTTP\r\n\r\n")
    stop.wait()


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """A reply a byte every 0.2 s, without end: no socket read ever waits long enough to time out."""
    for byte in itertools.chain(b"HTTP/1.1 200 OK\r\nx-amz-pad: ", itertools.repeat(ord("a"))):
        if stop.wait(0.2):
            return
        conn.sendall(bytes([byte]))


@contextlib.contextmanager
def endpoint(after_first: Misbehaviour | None = None):
    """http://127.0.0.1:PORT of a listener on a thread. Without after_first it accepts connections and never sends
    a byte; with it, it answers the first request (a store's probe) with 200 and hands the connection of every
    later request to after_first(conn, stop). Closed, and every connection with it, on exit."""
    server = socket.create_server(("127.0.0.1", 0))
    stop, held, requests = threading.Event(), [], itertools.count()

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client or the test closed it
            while after_first is not None and read_request(conn):
                if next(requests):
                    return after_first(conn, stop)
                conn.sendall(HTTP_OK)

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed: done
            while True:
                held.append(server.accept()[0])
                threading.Thread(target=serve, args=(held[-1],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()
        for conn in held:
            conn.close()


class FaultyProxy:
    """A TCP proxy on 127.0.0.1 in front of a real S3 server: it forwards bytes both ways until `fail(misbehaviour)`;
    from then on every connection, open or new, gets the misbehaviour instead of the server's replies."""

    def __init__(self, upstream: str):
        host, port = upstream.removeprefix("http://").rstrip("/").split(":")
        self.upstream = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.stop, self.failed, self.held = threading.Event(), threading.Event(), []
        self.misbehaviour: Misbehaviour = stall
        self.failed_at: float | None = None

    def fail(self, misbehaviour: Misbehaviour) -> None:
        self.misbehaviour, self.failed_at = misbehaviour, time.monotonic()
        self.failed.set()

    def _to_client(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self.failed.is_set():
                upstream.settimeout(0.1)
                try:
                    data = upstream.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return client.shutdown(socket.SHUT_WR)
                client.sendall(data)
            self.misbehaviour(client, self.stop)

    def _to_upstream(self, client: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if not self.failed.is_set():
                    upstream.sendall(data)

    def _serve(self, client: socket.socket) -> None:
        if self.failed.is_set():
            with contextlib.suppress(OSError):
                if read_request(client):
                    self.misbehaviour(client, self.stop)
            return
        upstream = socket.create_connection(self.upstream)
        self.held.append(upstream)
        threading.Thread(target=self._to_upstream, args=(client, upstream), daemon=True).start()
        self._to_client(client, upstream)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.held.append(self.server.accept()[0])
                threading.Thread(target=self._serve, args=(self.held[-1],), daemon=True).start()

    def __enter__(self) -> FaultyProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.close()
        for conn in self.held:
            conn.close()


def silent_endpoint():
    """A listener that accepts connections and never sends a byte."""
    return endpoint()


@contextlib.contextmanager
def refusing_endpoint():
    yield f"http://127.0.0.1:{free_port()}"  # nothing listens there


def manifests(store: Store, prefix: str) -> list[str]:
    """Keys of every checkpoint (a directory holding a MANIFEST.json) under prefix."""
    return sorted(k[: -len(MANIFEST) - 1] for k in store.list(prefix) if k.endswith(f"/{MANIFEST}"))


def unverified(store: Store, prefix: str) -> dict[str, list[str]]:
    """Checkpoint -> problems, for every manifest under prefix that does not verify by sha256."""
    return {k: p for k in manifests(store, prefix) if (p := verify(store, k))}


def s3_recipe(tmp_path: Path, endpoint: str, bucket: str, *overrides: str):
    """The fault recipe (kill.yaml) with its store in bucket on endpoint."""
    from cascade.flows.recipes import load_recipe

    return load_recipe(
        str(KILL_RECIPE),
        [
            f"storage.root=s3://{bucket}/cascade",
            f"storage.endpoint_url={endpoint}",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
            *overrides,
        ],
    )


def stage_ctx(recipe, workdir: Path, name: str, run_id: str = "r", sink=None):
    from cascade.stages.train.context import ListSink, StageContext

    store = Store.from_config(recipe.storage)
    index = [s.name for s in recipe.stages].index(name)
    workdir.mkdir(parents=True, exist_ok=True)
    return StageContext(recipe, store, run_id, f"runs/{run_id}/{index:02d}-{name}", sink or ListSink(), workdir=workdir)


class Preempted(RuntimeError):
    pass


def preempt_at(monkeypatch, owner, attr: str, call: int) -> None:
    """Make the call-th call of owner.attr raise Preempted (an in-process stand-in for a kill at that point)."""
    real, calls = getattr(owner, attr), []

    def wrapper(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise Preempted(f"preempted at call {call} of {attr}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, wrapper)


def stage_weights(ctx) -> dict:
    from safetensors.torch import load

    return load(ctx.store.read_bytes(f"{ctx.key}/model/model.safetensors"))
