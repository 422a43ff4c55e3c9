"""One writer per run: the lease refuses a second live owner, takes over expired or dead ones, guards commits."""

import json
import re
import subprocess
import sys
import time

import pytest

from cascade.artifacts import checkpoint
from cascade.artifacts.checkpoint import MANIFEST, write_checkpoint
from cascade.artifacts.lease import Lease, LeaseHeld, LeaseLost, lease_key, read_lease
from tests.artifacts.servers import ROOT


@pytest.fixture
def store(any_store):
    return any_store


def test_acquire_renew_release(store):
    with Lease(store, "r1", ttl=30, settle=0.05) as lease:
        info = read_lease(store, "r1")
        assert info["token"] == lease.token and info["expires"] > time.time() + 20
        before = info["expires"]
        time.sleep(0.01)
        lease.renew()
        assert read_lease(store, "r1")["expires"] > before
    assert read_lease(store, "r1") is None and not store.exists(lease_key("r1"))


def test_second_owner_is_refused_with_owner_and_expiry(store):
    with Lease(store, "r1", ttl=30, settle=0.05) as first:
        with pytest.raises(LeaseHeld) as info:
            Lease(store, "r1", settle=0.05).acquire()
        message = str(info.value)
        assert "run 'r1' is being written by another process" in message
        assert f"token {first.token[:8]}" in message and "lease expires" in message
        # the refusal comes a moment after the acquire (an S3 round trip or two), so 30s may have become 29s
        left = int(re.search(r"\(in (\d+)s\)", message).group(1))
        assert 25 <= left <= 30, message
        assert read_lease(store, "r1")["token"] == first.token  # the refused one changed nothing


def test_expired_lease_is_taken_over_and_the_old_owner_stops(store, local_dir, caplog):
    old = Lease(store, "r1", ttl=0.3, settle=0.05)
    old.acquire()
    old._stop.set()  # the old owner hangs: no renewals
    time.sleep(0.35)
    new = Lease(store, "r1", ttl=30, settle=0.05).acquire()
    assert "taking over a stale lease" in caplog.text
    try:
        with pytest.raises(LeaseLost, match="lost its lease"):  # the old owner can no longer commit
            write_checkpoint(store, "runs/r1/01-sft", local_dir, stage="sft", step=1, parent=None, config_hash="h")
        assert not store.exists(f"runs/r1/01-sft/{MANIFEST}")
        checkpoint.COMMIT_GUARDS.remove(old._guard)
        write_checkpoint(store, "runs/r1/01-sft", local_dir, stage="sft", step=1, parent=None, config_hash="h")
        assert store.exists(f"runs/r1/01-sft/{MANIFEST}")  # the new owner can
        old.release()
        assert read_lease(store, "r1")["token"] == new.token  # releasing a lost lease does not delete the new one
    finally:
        new.release()


def test_losing_the_race_in_the_settle_window_refuses(store, monkeypatch):
    lease = Lease(store, "r1", settle=0.05)
    real_sleep = time.sleep

    def rival_writes(seconds):  # another process's PUT lands between our write and our re-read
        store.write_bytes(
            lease_key("r1"),
            json.dumps({"token": "rival", "host": "elsewhere", "pid": 1, "expires": time.time() + 60}).encode(),
        )
        real_sleep(seconds)

    monkeypatch.setattr("cascade.artifacts.lease.time.sleep", rival_writes)
    with pytest.raises(LeaseHeld, match="claimed the lease at the same moment"):
        lease.acquire()
    assert lease._guard not in checkpoint.COMMIT_GUARDS


def test_a_dead_owner_on_this_host_is_taken_over_at_once(store, tmp_path):
    """`kill -9` leaves a lease that has not expired; its pid is gone, so resume need not wait out the TTL."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(child.stdout)
    import socket

    store.write_bytes(
        lease_key("r1"),
        json.dumps(
            {
                "token": "dead",
                "host": socket.gethostname(),
                "pid": dead_pid,
                "proc_start": "1",
                "expires": time.time() + 600,
            }
        ).encode(),
    )
    with Lease(store, "r1", settle=0.05) as lease:
        assert read_lease(store, "r1")["token"] == lease.token


def test_a_live_owner_in_another_process_is_refused(store, tmp_path):
    """The concurrent-run case end to end: another process holds the lease; this one is refused."""
    script = (
        "import sys, time\n"
        "from artifacts.store import Store\n"
        "from artifacts.lease import Lease\n"
        f"store = Store({store.uri('')!r}, {store_options(store)!r})\n"
        "lease = Lease(store, 'r1', ttl=20, settle=0.05).acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match=f"pid {proc.pid}"):
            Lease(store, "r1", settle=0.05).acquire()
    finally:
        proc.kill()
        proc.wait()
    with Lease(store, "r1", settle=0.05):  # killed: its pid is gone, so the lease is free at once
        pass


def store_options(store):
    if store.protocol == "file":
        return None
    return {"client_kwargs": {"endpoint_url": store.fs.client_kwargs["endpoint_url"]}, "use_listings_cache": False}


@pytest.fixture
def local_dir(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "w.bin").write_bytes(b"weights")
    return d
