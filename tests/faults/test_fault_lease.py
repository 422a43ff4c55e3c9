"""A second run with the same run id is refused while the first holds a live lease (on S3, across processes);
a SIGKILLed holder's lease is taken over at once on the same host; another host's lease only once it expires.

This is the lease API the CLI and flow wrap (see artifacts/lease.py); the refusal message is what the user sees.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cascade.artifacts.lease import Lease, LeaseHeld, lease_key, read_lease
from cascade.artifacts.store import Store
from tests.artifacts.servers import ROOT
from tests.faults.conftest import new_bucket

pytestmark = pytest.mark.slow

HOLDER = """
import sys, time
from cascade.artifacts.store import Store
from cascade.artifacts.lease import Lease
store = Store(sys.argv[1], {"client_kwargs": {"endpoint_url": sys.argv[2]}, "use_listings_cache": False})
lease = Lease(store, "same-id", ttl=float(sys.argv[3]), settle=0.1).acquire()
print("holding", flush=True)
time.sleep(120)
"""


def hold(root: str, endpoint: str, ttl: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, root, endpoint, str(ttl)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_concurrent_run_is_refused_until_the_holder_dies(s3):
    root = f"s3://{new_bucket(s3.url)}/cascade"
    store = Store(root, {"client_kwargs": {"endpoint_url": s3.url}, "use_listings_cache": False})
    holder = hold(root, s3.url, ttl=3.0)
    try:
        time.sleep(1.5)  # past one renewal (ttl/3): the lease stays live while its holder runs
        with pytest.raises(LeaseHeld) as info:
            Lease(store, "same-id", settle=0.1).acquire()
        assert f"pid {holder.pid}" in str(info.value) and "lease expires" in str(info.value)
        time.sleep(3.5)  # longer than the TTL: only renewals keep it live
        with pytest.raises(LeaseHeld):
            Lease(store, "same-id", settle=0.1).acquire()
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with Lease(store, "same-id", settle=0.1) as lease:  # dead holder on this host: no need to wait out the TTL
        assert read_lease(store, "same-id")["token"] == lease.token
    assert read_lease(store, "same-id") is None


def test_another_hosts_lease_is_taken_over_only_after_expiry(s3):
    store = Store(f"s3://{new_bucket(s3.url)}/cascade", {"client_kwargs": {"endpoint_url": s3.url}})
    other = {"token": "other-host", "host": "some-other-host", "pid": 1, "expires": time.time() + 30}
    store.write_bytes(lease_key("same-id"), json.dumps(other).encode())
    with pytest.raises(LeaseHeld, match="host some-other-host pid 1"):  # its pid means nothing here: only expiry
        Lease(store, "same-id", settle=0.1).acquire()
    store.write_bytes(lease_key("same-id"), json.dumps(dict(other, expires=time.time() - 1)).encode())
    with Lease(store, "same-id", settle=0.1) as lease:
        assert read_lease(store, "same-id")["token"] == lease.token
