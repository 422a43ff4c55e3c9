"""An S3 endpoint that cannot be reached fails the CLI fast: within 30 s, one line naming the endpoint, exit code
2, nothing written. Before, a listener that accepts and never answers held `cascade run` for about 20 minutes
(every request waited out its read timeout, under three layers of retries), and a refused port took 16 s and
printed a 400-line traceback. An endpoint that answers the first request and then stalls, answers bytes that are
not HTTP, or trickles its reply a byte at a time fails within 60 s, in one line, exit code 2; so does a run whose
store starts to misbehave mid-run, whichever layer (ours, Prefect's results) is talking to it.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.artifacts.servers import FAKE_KEYS
from tests.faults.conftest import (
    FaultyProxy,
    cascade,
    cli_env,
    endpoint,
    new_bucket,
    not_http,
    refusing_endpoint,
    run_cli,
    silent_endpoint,
    stall,
    trickle,
)

# Not `serial`: the budgets count CLI start-up, which other workers' load slows, but they leave room for it (at
# load 2 the never-answering endpoint failed the CLI in 12.6 s of its 30, a misbehaving one in 22 s of its 60),
# and these tests mostly wait on deadlines: in the parallel part they cost the suite little CPU, not 2 minutes.
BUDGET_S = 30
MISBEHAVING_BUDGET_S = 60  # the probe answered, so an operation's deadline (20 s) runs, after CLI start-up
pytestmark = pytest.mark.slow  # a minute and a half of waiting on deadlines: started early, beside CPU work


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


@pytest.mark.parametrize("misbehaviour", [stall, not_http, trickle])
def test_an_endpoint_that_answers_the_probe_then_misbehaves_fails_in_one_line(tmp_path, misbehaviour):
    """Before: a stall took 101 s and printed a 322-line traceback, bytes that are not HTTP a 375-line one, and a
    reply trickled a byte at a time (every socket read gets its byte, so no read timeout fires) never ended."""
    home = tmp_path / "home"
    with endpoint(misbehaviour) as url:
        result, elapsed = run_cli(["status", "--store", "s3://b/x"], home, AWS_ENDPOINT_URL=url)
    lines = result.stderr.strip().splitlines()
    assert elapsed < MISBEHAVING_BUDGET_S, f"{elapsed:.0f} s: {result.stderr[-2000:]}"
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"cascade: error: S3 endpoint {url}: ") and "Traceback" not in result.stdout
    print(f"{misbehaviour.__name__}: {elapsed:.1f} s: {lines[0]}")


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
        with pytest.raises(st.StoreFailed) as info:
            store.write_bytes("runs/r/LEASE.json", b"{}")
        elapsed = time.monotonic() - started
    assert elapsed < st.body_deadline(2) + 3 + 1, elapsed
    assert "write s3://b/x/runs/r/LEASE.json failed after" in str(info.value)
    assert isinstance(info.value.__cause__, TimeoutError)  # the deadline's, kept as the cause


MID_RUN_BUDGET_S = 60  # from the fault to the run's one line


@pytest.mark.parametrize(
    ("misbehaviour", "when"),
    [
        (stall, "01 sft:sft: 1/"),  # mid-training: step checkpoints, the step log, the lease
        (trickle, "01 sft:sft: 6/6"),  # the stage's commit, then Prefect's result of it
        (not_http, "00 sft_data:sft_data: 2/2"),  # the data build's commit, then the next stage's cache lookup
    ],
    ids=["stall-mid-stage", "trickle-at-commit", "not-http-between-stages"],
)
def test_a_store_that_fails_mid_run_ends_the_run_in_one_line_within_a_minute(
    s3, prefect_api, tmp_path, misbehaviour, when
):
    """A real S3 API behind a proxy that starts to misbehave mid-run. Before: a trickle held the run for over 15
    minutes in Prefect's listing of its results (Prefect's remote file system has no deadline), a stall ended after
    7 minutes and bytes that are not HTTP after 75 s: every remaining write waited out its own deadline."""
    bucket = new_bucket(s3.url)
    with FaultyProxy(s3.url) as proxy:
        args = ["run", "micro", f"storage.root=s3://{bucket}/x", f"storage.endpoint_url={proxy.url}"]
        env = cli_env(tmp_path / "home", proxy.url, prefect_api)  # the worker's Prefect server: one start, not three
        run = cascade([*args, "tracking.enabled=false", "--run-id", "mid"], env)
        watchdog = threading.Timer(MID_RUN_BUDGET_S + 240, os.killpg, (run.pid, signal.SIGKILL))
        watchdog.start()
        lines = []
        for line in run.stdout:
            lines.append(line.rstrip("\n"))
            if proxy.failed_at is None and line.startswith(when):
                proxy.fail(misbehaviour)
        run.wait()
        watchdog.cancel()
        after = time.monotonic() - proxy.failed_at if proxy.failed_at else None
    output = "\n".join(lines)
    assert after is not None, output  # the run reached the fault's moment
    assert after < MID_RUN_BUDGET_S, f"{after:.0f} s after the fault: {output[-3000:]}"
    errors = [line for line in lines if line.startswith("cascade: error: ")]
    assert run.returncode == 2 and len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert errors[0].startswith(f"cascade: error: S3 endpoint {proxy.url}: "), errors[0]
    print(f"{misbehaviour.__name__} at {when!r}: {after:.1f} s after the fault: {errors[0]}")


def test_prefects_results_on_s3_go_through_the_store(s3, prefect_api, monkeypatch):
    """The run's result block reads back what it wrote (as Prefect does, loaded by its saved name), and against an
    endpoint that trickles, a read ends within the store's deadline in one line instead of never."""
    from prefect.blocks.core import Block

    from cascade.artifacts import store as st
    from cascade.flows.recipes import load_recipe
    from cascade.tasks.results import RunResults, result_storage

    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    for k, v in FAKE_KEYS.items():
        monkeypatch.setenv(k, v)
    recipe = load_recipe("micro", [f"storage.root=s3://{new_bucket(s3.url)}/x", f"storage.endpoint_url={s3.url}"])
    block = result_storage(recipe, "r1")
    assert isinstance(block, RunResults) and block.prefix == "runs/r1/prefect-results"
    block.write_path("abc", b"result bytes")
    loaded = Block.load(f"cascade-run-results/{block._block_document_name}")
    assert loaded.read_path("abc", _sync=True) == b"result bytes"
    assert st.Store.from_config(recipe.storage).read_bytes("runs/r1/prefect-results/abc") == b"result bytes"

    with endpoint(trickle) as url:
        slow = RunResults(storage={"root": "s3://b/x", "endpoint_url": url}, prefix="runs/r/prefect-results")
        monkeypatch.setattr(st, "_REACHED", {(url, "b")})  # as if it had answered at the start of the run
        started = time.monotonic()
        with pytest.raises(st.StoreFailed, match=f"S3 endpoint {url}: read s3://b/x/runs/r/prefect-results/abc"):
            slow.read_path("abc")
    assert time.monotonic() - started < st.OPERATION_DEADLINE_S + 5
