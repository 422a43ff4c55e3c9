"""HTTP client of an OpenAI-compatible vLLM server: requests, retries, and what a failure means.

Plain `urllib.request` + `json`, so the trainer side never imports vllm (the server runs from its own venv,
see `server.py`). The client knows nothing about processes; it serves a managed server and someone else's
(external) server alike. Failures map to:
- connection errors and 5xx: retried with backoff, then `ServerUnavailable`; or `ServerDied` at once when the
  optional `died` hook reports that the server process has exited (the engine restarts on both);
- 4xx: RuntimeError at once (a 404 hints at weight-sync endpoints missing without VLLM_SERVER_DEV_MODE=1);
- timeouts: TimeoutError at once. A hung (not dead) server therefore surfaces after `request_timeout`, with
  no restart.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from cascade.stages.engines.interface import Completion

# Proxies from the environment must never see loopback traffic.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ServerDied(RuntimeError):
    """The managed server process exited."""


class ServerUnavailable(RuntimeError):
    """The server did not answer (connection errors or 5xx) after all retries."""


class _Retryable(Exception):
    pass


def healthy(url: str) -> bool:
    """GET /health answers 200 (a short timeout: it is polled while the server starts)."""
    try:
        with _OPENER.open(url + "/health", timeout=2.0) as resp:
            return resp.status == 200
    except (OSError, http.client.HTTPException):
        return False


class VLLMClient:
    """Calls to one server at `url`. A managed server gets a new port on restart, so the engine re-aims `url`.

    `died`, when given, returns a description of the server process's exit, or None while it runs; it turns a
    connection failure into `ServerDied` without waiting out the retries.
    """

    def __init__(
        self, url: str, *, request_timeout: float, max_retries: int, died: Callable[[], str | None] | None = None
    ):
        self.url = url.rstrip("/")
        self.request_timeout, self.max_retries = request_timeout, max_retries
        self._died = died

    def post(self, path: str, body: dict[str, Any] | None = None, method: str = "POST") -> Any:
        """One call, retried with backoff on connection errors and 5xx; 4xx and timeouts raise at once."""
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(self.max_retries + 1):
            try:
                return self._request_once(method, path, data)
            except _Retryable as err:
                death = self._died() if self._died is not None else None
                if death is not None:
                    raise ServerDied(death) from err
                if attempt == self.max_retries:
                    raise ServerUnavailable(f"{method} {self.url}{path} failed {attempt + 1} times: {err}") from err
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise AssertionError("unreachable")

    def _request_once(self, method: str, path: str, data: bytes | None) -> Any:
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with _OPENER.open(req, timeout=self.request_timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:2000]
            if err.code >= 500:
                raise _Retryable(f"HTTP {err.code}: {detail}") from err
            hint = " (weight sync needs a server started with VLLM_SERVER_DEV_MODE=1)" if err.code == 404 else ""
            raise RuntimeError(f"vLLM {method} {path} -> HTTP {err.code}{hint}: {detail}") from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(err, TimeoutError) or isinstance(reason, TimeoutError):
                raise TimeoutError(f"vLLM {method} {path}: no answer in {self.request_timeout:.0f}s") from err
            raise _Retryable(f"{type(reason).__name__}: {reason}") from err
        return json.loads(raw) if raw else None

    def served_model_name(self) -> str:
        models = self.post("/v1/models", method="GET")["data"]
        if not models:
            raise RuntimeError(f"{self.url} serves no model")
        return models[0]["id"]


def _to_completion(choice: dict[str, Any]) -> Completion:
    """One /v1/completions choice (asked with `logprobs` and `return_token_ids`) as a Completion."""
    ids = choice.get("token_ids")
    if ids is None:
        raise RuntimeError("server returned no token_ids: it needs a vLLM that supports `return_token_ids`")
    logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise RuntimeError(f"unexpected finish_reason {reason!r} from vLLM (aborted request?)")
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(ids)} tokens but {len(logprobs)} logprobs")
    return Completion(list(ids), logprobs, choice.get("text", ""), reason)
