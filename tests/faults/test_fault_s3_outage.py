"""The S3 server goes away mid-upload. s3rver (npm; keeps its objects on disk) plays the server, so that when it
comes back it has what was committed before the outage, as a real S3 would.

- A short outage: the store's retries (exponential backoff) ride it out and the stage completes.
- A long one: the stage fails cleanly (the botocore error, with a note naming the checkpoint not committed), no
  manifest is written for the cut-off checkpoint; once the server is back, resume completes from the last
  committed step, with the weights of a run that never saw an outage.
"""

import threading
import time

import pytest
import torch
from botocore.exceptions import EndpointConnectionError

from cascade.artifacts.checkpoint import MANIFEST, committed
from cascade.artifacts.store import Store
from cascade.stages.kinds import StageInputs
from cascade.stages.kinds.sft.run_sft import run_sft
from cascade.stages.kinds.sft_data.run_sft_data import run_sft_data
from tests.artifacts.servers import have_s3rver, make_bucket, s3rver_server
from tests.faults.conftest import s3_recipe, stage_ctx, stage_weights, unverified

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not have_s3rver(), reason="s3rver not installed (.ci/install-debian.sh installs it into .ci/node_modules)"
    ),
]
KEYS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}


@pytest.fixture
def s3rver(tmp_path, monkeypatch):
    for k, v in KEYS.items():
        monkeypatch.setenv(k, v)
    server = s3rver_server(tmp_path, tmp_path / "s3rver-data").start()
    make_bucket(server.url, "outage", KEYS)
    yield server
    server.stop()


def kill_server_at(monkeypatch, server, step_dir: str, nth: int, on_kill=None):
    """SIGKILL the server just before the nth upload into step_dir: uploads in flight in other threads die too."""
    real, seen, lock = Store.put_file, [], threading.Lock()

    def put_file(self, local, key):
        if f"/{step_dir}/" in key:
            with lock:
                seen.append(key)
                if len(seen) == nth:
                    server.kill()
                    if on_kill:
                        on_kill()
        return real(self, local, key)

    monkeypatch.setattr(Store, "put_file", put_file)


def test_short_outage_is_ridden_out_by_retries(s3rver, tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_STORE_ATTEMPTS", "8")
    monkeypatch.setenv("CASCADE_STORE_BACKOFF", "0.3")
    recipe = s3_recipe(tmp_path, s3rver.url, "outage")
    data = run_sft_data(recipe.stage("sft_data"), stage_ctx(recipe, tmp_path, "sft_data"), StageInputs()).checkpoint
    ctx = stage_ctx(recipe, tmp_path, "sft")
    restart = lambda: threading.Timer(1.5, s3rver.start).start()  # noqa: E731 - back after 1.5 s
    kill_server_at(monkeypatch, s3rver, "steps/2", 2, on_kill=restart)
    run_sft(recipe.stage("sft"), ctx, StageInputs(stages={"sft_data": data}))
    assert committed(ctx.store, ctx.key) is not None
    assert unverified(ctx.store, ctx.key) == {}


def test_long_outage_fails_cleanly_then_resume_completes(s3rver, tmp_path, monkeypatch):
    monkeypatch.setenv("CASCADE_STORE_ATTEMPTS", "2")
    monkeypatch.setenv("CASCADE_STORE_BACKOFF", "0.1")
    recipe = s3_recipe(tmp_path, s3rver.url, "outage")
    cfg = recipe.stage("sft")
    data = run_sft_data(
        recipe.stage("sft_data"), stage_ctx(recipe, tmp_path / "a", "sft_data"), StageInputs()
    ).checkpoint
    straight = stage_ctx(recipe, tmp_path / "a", "sft", run_id="straight")
    run_sft(cfg, straight, StageInputs(stages={"sft_data": data}))

    ctx = stage_ctx(recipe, tmp_path / "b", "sft")
    kill_server_at(monkeypatch, s3rver, "steps/3", 3)
    started = time.time()
    with pytest.raises(Exception) as info:
        run_sft(cfg, ctx, StageInputs(stages={"sft_data": data}))
    elapsed = time.time() - started
    assert isinstance(info.value, EndpointConnectionError) or "EndpointConnectionError" in repr(info.value), info.value
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "not committed" in notes and "steps/3" in notes
    monkeypatch.undo()

    s3rver.start()  # the server is back, with what it had stored
    ctx.store.invalidate()
    assert not ctx.store.exists(f"{ctx.key}/steps/3/{MANIFEST}") and committed(ctx.store, f"{ctx.key}/steps/3") is None
    assert committed(ctx.store, f"{ctx.key}/steps/2") is not None
    resumed = stage_ctx(recipe, tmp_path / "c", "sft")
    run_sft(cfg, resumed, StageInputs(stages={"sft_data": data}))
    assert unverified(resumed.store, resumed.key) == {}
    for name, tensor in stage_weights(straight).items():
        assert torch.allclose(stage_weights(resumed)[name], tensor, atol=1e-6), name
    print(f"failed cleanly {elapsed:.1f}s after the start of the stage")
