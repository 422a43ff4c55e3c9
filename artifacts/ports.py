"""A TCP port no process listens on: for the local servers (Prefect, MLflow, vLLM, Ray) and torch's rendezvous."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out on `host` ("" : every interface) and released; free unless another process
    takes it before the caller binds it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
