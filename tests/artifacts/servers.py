"""Real servers for storage and tracking tests, each a subprocess on a free local port.

moto's S3 server (in memory: a restart loses its objects), s3rver (npm, persists to a directory: used where a
server must come back with its data), and an MLflow tracking server with its artifacts on S3.
Every server is stopped by the fixture that started it; nothing here is left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from cascade.artifacts.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
S3RVER = ROOT / ".ci" / "node_modules" / ".bin" / "s3rver"
FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{url}: server exited with {proc.returncode}: "
                + (log.read_text()[-2000:] if log and log.exists() else "")
            )
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers: ready (S3 servers answer / with 403 or 404 depending on the server)
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s")


class Server:
    """A subprocess with start/stop/kill and a log file."""

    def __init__(
        self, args: list[str], port: int, ready_path: str, log: Path, env: dict | None = None, timeout: float = 60
    ):
        self.args, self.port, self.ready_path, self.log, self.timeout = args, port, ready_path, log, timeout
        self.env = dict(os.environ, **(env or {}))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            self.args, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        out.close()
        wait_http(self.url + self.ready_path, self.proc, self.timeout, self.log)
        return self

    def kill(self) -> None:
        """SIGKILL the server's process group: in-flight requests die mid-transfer."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def moto_server(tmp: Path) -> Server:
    port = free_port()
    return Server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, "/", tmp / "moto.log")


def s3rver_server(tmp: Path, data_dir: Path, port: int | None = None) -> Server:
    port = port or free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    return Server(
        [str(S3RVER), "-d", str(data_dir), "-a", "127.0.0.1", "-p", str(port), "--silent"],
        port,
        "/",
        tmp / "s3rver.log",
    )


def have_s3rver() -> bool:
    return S3RVER.exists() and shutil.which("node") is not None


def make_bucket(endpoint: str, bucket: str, keys: dict | None = None) -> None:
    import boto3

    keys = keys or FAKE_KEYS
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)


def mlflow_server(tmp: Path, s3_endpoint: str, bucket: str) -> Server:
    port = free_port()
    env = dict(
        FAKE_KEYS,
        MLFLOW_S3_ENDPOINT_URL=s3_endpoint,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
        AWS_DEFAULT_REGION="us-east-1",
    )
    args = [
        str(BIN / "mlflow"),
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{tmp / 'mlflow-server.db'}",
        "--artifacts-destination",
        f"s3://{bucket}/mlartifacts",
    ]
    return Server(args, port, "/health", tmp / "mlflow-server.log", env=env, timeout=120)
