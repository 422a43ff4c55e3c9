"""The OpenAI-compatible teacher against a real vLLM server (from .venv-vllm) serving a tiny Qwen2.

One server for the module. A fault-injecting proxy (stdlib http.server on 127.0.0.1, written here) sits in front
of it and, on chosen request numbers, answers 500, stalls past the client's timeout, or cuts the JSON short.

The tiny model is rigged (tests/stages/rigged.py) so that every greedy answer is "7", from the server.
"""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request

import pytest

from cascade.artifacts.checkpoint import committed, verify
from cascade.artifacts.store import Store
from cascade.stages.datasets.shards import DATA_DIR, shard_paths
from cascade.stages.datasets.teachers import TeacherError
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from cascade.stages.recipe.schema import validate_recipe
from cascade.stages.train.context import ListSink, StageContext
from tests.stages.rigged import rigged_vllm_server
from tests.stages.test_vllm_engine import TINY, require_vllm_venv

pytestmark = pytest.mark.vllm

ROWS, SHARD = 24, 8  # three shards of eight prompts


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    require_vllm_venv()
    with rigged_vllm_server(tmp_path_factory, TINY) as url:
        yield url  # the server root; the teacher URL is root + /v1


class FaultProxy(http.server.ThreadingHTTPServer):
    """Forwards POSTs to the server; `faults` maps a 1-based request number to "500", "stall" or "malformed"."""

    daemon_threads = True

    def __init__(self, upstream: str):
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        self.upstream, self.faults, self.stall_s = upstream, {}, 6.0
        self.count, self.lock = 0, threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        proxy: FaultProxy = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with proxy.lock:
            proxy.count += 1
            fault = proxy.faults.get(proxy.count)
        if fault == "500":
            return self._reply(500, b'{"error": "injected"}')
        if fault == "stall":
            time.sleep(proxy.stall_s)  # the client has given up by now; its retry is a new request
        req = urllib.request.Request(
            proxy.upstream + self.path, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, data = err.code, err.read()
        self._reply(status, data[: len(data) // 2] if fault == "malformed" else data)

    def _reply(self, status: int, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a stalled request whose client left

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy(upstream):
    server = FaultProxy(upstream)
    yield server
    server.stop()


def teacher_recipe(tmp_path, url: str, name: str, **teacher):
    settings = {
        "kind": "openai",
        "url": url,
        "model": "cascade-policy",
        "max_new_tokens": 4,
        "batch_size": 4,
        "backoff_s": 0.05,
        **teacher,
    }
    return validate_recipe(
        {
            "storage": {"root": f"file://{tmp_path}/{name}"},
            "domains": {"math": {"train_size": ROWS, "heldout_size": 16}},
            "stages": [{"kind": "sft_data", "shard_rows": SHARD, "verify": False, "teacher": settings}],
        }
    )


def build(recipe, tmp_path, name: str):
    store = Store.from_config(recipe.storage)
    ctx = StageContext(recipe, store, name, f"runs/{name}/00-sft_data", ListSink(), workdir=tmp_path)
    return run_sft_data(recipe.stages[0], ctx, StageInputs()), ctx


def rows_of(ctx) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for p in shard_paths(ctx.store.path(f"{ctx.key}/{DATA_DIR}")) for r in pq.read_table(p).to_pylist()]


@pytest.fixture(scope="module")
def direct_rows(upstream, tmp_path_factory):
    """The build straight against the server: what every faulty build must end up with."""
    tmp = tmp_path_factory.mktemp("direct")
    result, ctx = build(teacher_recipe(tmp, upstream + "/v1", "direct"), tmp, "direct")
    assert result.metrics["rows"] == ROWS and result.metrics["dropped/teacher_error"] == 0
    return rows_of(ctx)


def test_the_server_answers_every_prompt(direct_rows):
    assert [r["messages"][1]["content"] for r in direct_rows] == ["7"] * ROWS
    assert len({r["messages"][0]["content"] for r in direct_rows}) == ROWS


def test_5xx_and_a_timeout_are_retried_and_lose_nothing(proxy, direct_rows, tmp_path):
    proxy.faults = {2: "500", 7: "500", 12: "stall"}
    result, ctx = build(teacher_recipe(tmp_path, proxy.url, "r", timeout_s=2.5), tmp_path, "r")
    assert rows_of(ctx) == direct_rows
    assert proxy.count == ROWS + 3  # each fault cost exactly one retry
    assert result.metrics["teacher_rows"] == ROWS and result.metrics["teacher_retries"] == 3
    assert result.metrics["dropped/teacher_error"] == 0


def test_a_server_that_keeps_failing_is_one_clear_error(proxy, tmp_path):
    proxy.faults = {n: "500" for n in range(1, 100)}
    with pytest.raises(TeacherError) as err:
        build(teacher_recipe(tmp_path, proxy.url, "f", max_retries=2), tmp_path, "f")
    assert "HTTP 500" in str(err.value) and "3 attempts" in str(err.value) and "\n" not in str(err.value)


def test_malformed_reply_is_a_clear_error_and_committed_shards_survive(proxy, direct_rows, tmp_path):
    recipe = teacher_recipe(tmp_path, proxy.url, "m")
    proxy.faults = {2 * SHARD + 3: "malformed"}  # in the third shard
    with pytest.raises(TeacherError) as err:
        build(recipe, tmp_path, "m")
    message = str(err.value)
    assert "malformed response" in message and "not JSON" in message and "\n" not in message
    store = Store.from_config(recipe.storage)
    shards = [f"runs/m/00-sft_data/shards/{k:05d}" for k in range(3)]
    assert [committed(store, key) is not None for key in shards] == [True, True, False]
    assert verify(store, shards[0]) == [] and verify(store, shards[1]) == []

    proxy.faults, proxy.count = {}, 0
    result, ctx = build(recipe, tmp_path, "m")
    assert result.metrics["shards_reused"] == 2 and proxy.count == SHARD  # only the lost shard is asked again
    assert rows_of(ctx) == direct_rows
