"""A Ray cluster of several nodes on this one host, for the tests and benchmarks of `compute.launcher: ray`.

`ray start` runs each node as its own set of processes, so one machine can hold a head and worker nodes that Ray
schedules as it would separate hosts: two training nodes of 1 CPU each and a rollout node that offers no CPU and
only the custom resource `rollout` (where `engine.ray_resources: {rollout: 1}` places a vLLM server). Every node
listens on 127.0.0.1. `ray stop --force` at the end stops every Ray node of the host.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cascade.artifacts.ports import free_port

RAY = str(Path(sys.executable).with_name("ray"))
START_TIMEOUT_S = 120


@contextmanager
def local_ray_cluster(home: Path, env: dict[str, str] | None = None, training_nodes: int = 2) -> Iterator[str]:
    """Starts the nodes (a head and training_nodes - 1 workers of 1 CPU each, and a rollout node) and yields the
    head's address. `home`: a HOME of their own (a local `ray.init()` leaves ~/.ray/auth_token, and with it there
    a second node's `ray start` is refused: InvalidAuthToken). Workers start at nice 0, not Ray's 15: beside other
    work a rank then took minutes to import torch."""
    port = free_port()
    env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", "RAY_worker_niceness": "0", "HOME": str(home)}
    common = ["--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    nodes = [["--head", f"--port={port}", "--include-dashboard=false", "--num-cpus=1"]]
    nodes += [[f"--address=127.0.0.1:{port}", "--num-cpus=1"]] * (training_nodes - 1)
    nodes += [[f"--address=127.0.0.1:{port}", "--num-cpus=0", '--resources={"rollout": 1}']]
    try:
        for node in nodes:
            subprocess.run(
                [RAY, "start", *node, *common], env=env, check=True, capture_output=True, timeout=START_TIMEOUT_S
            )
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], env=env, capture_output=True, timeout=START_TIMEOUT_S)
