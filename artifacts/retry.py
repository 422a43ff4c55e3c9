"""Retrying storage operations: which failures are transient, and how often and how long to try again.

A failure is transient when anything in its exception chain is throttling, a 5xx, or connection trouble (a
refused, reset or timed-out socket; botocore's and aiohttp's connection errors); never a 4xx or a missing key.
`retrying` tries again with exponential backoff and jitter, within `RetryPolicy`'s attempts and time budget.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("cascade.store")
T = TypeVar("T")

# Error codes S3 and S3-compatible servers send for throttling and server-side trouble.
TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "503",
    "500",
    "502",
    "504",
}
AIOHTTP_TRANSIENT = {"ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError", "ServerTimeoutError"}
TRANSIENT_ERRNOS = {
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EPIPE,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
}


@dataclass(frozen=True)
class RetryPolicy:
    """attempts in all, and no retry starts later than `budget` seconds after the first attempt did; the delay
    before retry n (1-based) is min(cap, base * 2**(n-1)) * uniform(0.5, 1)."""

    attempts: int = 5
    base: float = 0.5
    cap: float = 8.0
    budget: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        # An operator knob (and the fault tests'): how long a run rides out a storage outage before failing.
        attempts = int(os.environ.get("CASCADE_STORE_ATTEMPTS", cls.attempts))
        base = float(os.environ.get("CASCADE_STORE_BACKOFF", cls.base))
        budget = float(os.environ.get("CASCADE_STORE_BUDGET", cls.budget))
        return cls(attempts=max(1, attempts), base=base, budget=budget)

    def delay(self, attempt: int) -> float:
        return min(self.cap, self.base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def is_transient(exc: BaseException) -> bool:
    """Throttling, 5xx and connection trouble anywhere in the exception chain; not 4xx, not a missing key."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, FileNotFoundError | PermissionError):
            return False
        if isinstance(exc, ConnectionError | TimeoutError):  # builtin: refused, reset, aborted, broken pipe
            return True
        if isinstance(exc, OSError) and exc.errno in TRANSIENT_ERRNOS:
            return True
        module = type(exc).__module__
        if module.startswith("botocore") and type(exc).__name__ in {
            "EndpointConnectionError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ConnectTimeoutError",
            "ResponseStreamingError",
            "IncompleteReadError",
            "ProxyConnectionError",
            "HTTPClientError",
        }:
            return True
        if module.startswith("aiohttp") and {c.__name__ for c in type(exc).__mro__} & AIOHTTP_TRANSIENT:
            return True
        response = getattr(exc, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = str(response["Error"].get("Code", ""))
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
            return code in TRANSIENT_CODES or status >= 500 or status == 429
        exc = exc.__cause__ or exc.__context__
    return False


def answered(exc: BaseException) -> bool:
    """True when the server sent a response (an S3 error code) anywhere in the exception chain."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(getattr(exc, "response", None), dict):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def retrying(policy: RetryPolicy, what: str, fn: Callable[[], T]) -> T:
    """fn(), retried on transient errors; the last error is re-raised with a note saying how often it was tried."""
    started = time.monotonic()
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                if attempt > 1:
                    e.add_note(f"cascade: {what} failed after {attempt} attempts")
                raise
            wait, spent = policy.delay(attempt), time.monotonic() - started
            if attempt == policy.attempts or spent + wait > policy.budget:
                e.add_note(f"cascade: {what} failed after {attempt} attempts in {spent:.0f} s")
                raise
            # info, not a warning: a failure says how often it was tried, and the CLI's error stays one line
            log.info(
                "%s: transient %s (%s); retry %d/%d in %.1fs",
                what,
                type(e).__name__,
                str(e).splitlines()[0][:200] if str(e) else "",
                attempt,
                policy.attempts - 1,
                wait,
            )
            time.sleep(wait)
    raise AssertionError("unreachable")
