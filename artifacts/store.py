"""Object storage through fsspec: `file://` and `s3://` share one code path.

Keys are '/'-separated paths relative to the store root. Nothing here knows about checkpoints; it moves bytes
and files. Credentials are never accepted as arguments: s3fs reads them from the environment or the standard
AWS config, so they cannot leak into recipes, logs or MLflow params. The endpoint, region and profile come from
the recipe, else from the standard AWS variables (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION /
AWS_DEFAULT_REGION, AWS_PROFILE).

Every operation retries transient failures (throttling, 5xx, connection errors) with exponential backoff and
jitter. Below it, each HTTP request has a connect timeout and a read timeout (per socket read, so a large upload
to a slow but live server is not cut off), botocore tries it twice and s3fs once, so an outage reaches this
layer within seconds; `RetryPolicy` bounds the attempts and the time spent retrying (see RETRY BUDGET below).
A process's first request to an endpoint has a hard deadline (`PROBE_TIMEOUT_S`): an endpoint that refuses,
never answers or does not resolve fails at once with `StoreUnreachable`, one line naming it; one that answered
and later fails every attempt of an operation on connection trouble gives `StoreFailed`, one line. What arrives
on failure is not always an OSError: a stopped S3 server surfaces as botocore's EndpointConnectionError, and
s3fs wraps ClientErrors in OSError with the ClientError as `__cause__`, so `is_transient` walks the whole
exception chain.

Uploads and downloads hash the bytes they move (put_file/get_file return the sha256 when they can), so
checkpoint verification costs no extra pass over a file where avoidable: file:// copies hash as they copy
(uploads also write to a temp name and rename, so a kill never leaves a torn file); s3 single PUTs carry a
ChecksumSHA256 the server keeps (`stat_sha256` reads it back in one HEAD); s3 multipart uploads carry one per
part, and the server's composite is compared at once.

Listing caches are off for s3: another process (a resumed run, a lease holder, gc) writes the same prefix, and
a stale listing would hide its objects.

Remaining gaps: moto stores the ChecksumSHA256 header of a single PUT without checking it against the body
(AWS S3 and MinIO do check), so against moto that check proves the header round-trip only;
CASCADE_VERIFY_UPLOADS=reread re-reads instead. A delete racing a write of the same key is not ordered.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import fsspec
from fsspec.exceptions import FSTimeoutError

from cascade.artifacts.config import StorageConfig, url_from_env
from cascade.artifacts.retry import RetryPolicy, answered, is_transient, retrying
from cascade.artifacts.transfer import (
    MULTIPART_THRESHOLD,
    PART_SIZE,
    Upload,
    b64,
    copy_hashing,
    put_multipart,
)
from cascade.artifacts.urls import credential_error

log = logging.getLogger("cascade.store")
T = TypeVar("T")

# RETRY BUDGET. One HTTP request: connect within CONNECT_TIMEOUT_S, and no socket read stalls longer than
# READ_TIMEOUT_S (S3 servers answer a large PUT only once they hold it; 30 s covers a loaded MinIO or moto);
# botocore tries it BOTO_ATTEMPTS times, s3fs adds none; a request with a body also has `body_deadline`.
# One operation: RetryPolicy's attempts, none started later than `budget` seconds after the first. So an
# operation against an endpoint that goes silent mid-run ends within the budget plus one attempt (an attempt
# may be two requests: s3fs's `exists` is a HEAD, then a LIST), about 1.5 minutes; a refused port in seconds.
# An operation that moves no body (HEAD, LIST, DELETE, a small GET) also ends, every attempt included, within
# OPERATION_DEADLINE_S, and a small write (`write_bytes`: reports, manifests, leases, Prefect's results) within
# that plus its bytes at MIN_UPLOAD_RATE: a server that answered the probe and then stalls, or trickles its reply
# a byte at a time (which no per-read timeout ever catches), costs that long, not the read timeouts times every
# retry layer. File uploads (checkpoints) keep the per-request `body_deadline` under the retry budget.
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 30
BOTO_ATTEMPTS = 2
# First contact with an endpoint (per process): one HEAD of the bucket with this deadline, all tries included.
PROBE_TIMEOUT_S = 10
OPERATION_DEADLINE_S = 20
# aiohttp starts a request's read timeout only once its body is sent, and botocore sends PUTs with
# `Expect: 100-continue`, whose answer aiohttp awaits with no timeout: a PUT to a server that accepts and never
# answers waited forever. So requests with a body get a deadline: every try, plus the body at MIN_UPLOAD_RATE.
MIN_UPLOAD_RATE = 1 << 20  # bytes/s


def body_deadline(size: int) -> float:
    return BOTO_ATTEMPTS * (CONNECT_TIMEOUT_S + READ_TIMEOUT_S) + size / MIN_UPLOAD_RATE


class StoreError(RuntimeError):
    """The store cannot be used as configured; the CLI prints it as one line (exit code 2)."""


class StoreUnreachable(StoreError):
    """The S3 endpoint did not answer this process's first request to it."""


class StoreFailed(StoreError):
    """An S3 operation met connection trouble (no answer in time, a dropped connection, bytes that are not
    HTTP) on every attempt; the endpoint answered before, so the cause is the endpoint's, not the recipe's."""


_REACHED: set[tuple[str | None, str]] = set()  # (endpoint, bucket) pairs that have answered this process
# (endpoint, bucket) -> (when, StoreFailed) of its last operation that failed on connection trouble. For
# FAILING_HOLD_S after it, every operation on that bucket fails at once with the same error: a run whose store
# stops answering has several writes left (the step log, the report, the lease, Prefect's result), and each one
# waiting out its own deadline would add up to minutes between the fault and the run's one line.
_FAILING: dict[tuple[str | None, str], tuple[float, StoreFailed]] = {}
FAILING_HOLD_S = 60


def storage_options(cfg: StorageConfig) -> dict[str, Any]:
    """s3fs options from the recipe, else the standard AWS environment. Never credentials."""
    if not cfg.resolved_root().startswith("s3://"):
        return {}
    opts: dict[str, Any] = {"use_listings_cache": False}
    endpoint = cfg.endpoint_url or url_from_env("AWS_ENDPOINT_URL_S3") or url_from_env("AWS_ENDPOINT_URL")
    if endpoint:
        opts["client_kwargs"] = {"endpoint_url": endpoint}
    config_kwargs: dict[str, Any] = {}
    # Region goes to botocore's Config, not client_kwargs: s3fs turns client_kwargs' region_name into a
    # LocationConstraint when it creates a bucket, which us-east-1 servers (and moto) reject.
    region = cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        config_kwargs["region_name"] = region
    config_kwargs.update(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S)
    if not (os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE")):
        config_kwargs["retries"] = {"max_attempts": BOTO_ATTEMPTS, "mode": "standard"}  # the outer layer waits
    opts["config_kwargs"] = config_kwargs
    profile = cfg.profile or os.environ.get("AWS_PROFILE")
    if profile:
        opts["profile"] = profile
    return opts


class Store:
    def __init__(self, root: str, options: dict[str, Any] | None = None, retry: RetryPolicy | None = None):
        if options is None and root.startswith("s3://"):
            options = storage_options(StorageConfig(root=root))  # endpoint etc. from the environment
        self.endpoint = (options or {}).get("client_kwargs", {}).get("endpoint_url")
        if message := credential_error({"root": root, "endpoint_url": self.endpoint}, "storage"):
            raise StoreError(message)
        self.fs, path = fsspec.core.url_to_fs(root, **(options or {}))
        self.root = path.rstrip("/")
        self.protocol = root.split("://", 1)[0] if "://" in root else "file"
        if self.protocol == "s3":
            self.fs.retries = 1  # s3fs's own retries would multiply botocore's and ours (RETRY BUDGET above)
        self.retry = retry or RetryPolicy.from_env()
        # moto (and any server that does not validate checksums) stores the ChecksumSHA256 header it is sent
        # without checking it; CASCADE_VERIFY_UPLOADS=reread makes the check after upload read the bytes back.
        self.verify_by_reread = os.environ.get("CASCADE_VERIFY_UPLOADS", "").lower() == "reread"
        self.multipart_threshold, self.part_size = MULTIPART_THRESHOLD, PART_SIZE

    @classmethod
    def from_config(cls, cfg: StorageConfig) -> Store:
        return cls(cfg.resolved_root(), storage_options(cfg))

    def _do(self, what: str, key: str, fn: Callable[[], T], policy: RetryPolicy | None = None) -> T:
        if self.protocol == "s3":
            self._first_contact()
            self._check_not_failing(what, key)
        try:
            return retrying(policy or self.retry, f"{what} {self.uri(key)}", fn)
        except Exception as e:
            if self.protocol != "s3" or not is_transient(e):
                raise
            # One line for the CLI; the botocore/aiohttp error stays the cause, for a debugger.
            tried = (getattr(e, "__notes__", None) or [f"{what} {self.uri(key)} failed"])[-1].removeprefix("cascade: ")
            reason = str(e).splitlines()[0][:200] if str(e) else "no complete answer in time"
            failed = StoreFailed(
                f"S3 endpoint {self.endpoint or '(AWS default)'}: {tried} ({type(e).__name__}: {reason})"
            )
            _FAILING[self._bucket_id()] = (time.monotonic(), failed)
            raise failed from e

    def _bucket_id(self) -> tuple[str | None, str]:
        return self.endpoint, self.root.split("/", 1)[0]

    def _check_not_failing(self, what: str, key: str) -> None:
        """Within FAILING_HOLD_S of an operation on this bucket that failed on connection trouble: that error."""
        when, failed = _FAILING.get(self._bucket_id(), (None, None))
        if when is not None and time.monotonic() - when < FAILING_HOLD_S:
            later = time.monotonic() - when
            raise StoreFailed(f"{failed}; {what} {self.uri(key)} {later:.0f} s later was not tried")

    def _ask(self, what: str, key: str, call: Callable[..., T], *args: Any, body: int = 0, **kwargs: Any) -> T:
        """call(*args, **kwargs), an operation that moves no body or a small one (`body` bytes); on s3 every
        attempt, retries included, ends within OPERATION_DEADLINE_S of the first, plus the body's time at
        MIN_UPLOAD_RATE (s3fs's sync wrappers take `timeout` and cancel on expiry)."""
        if self.protocol != "s3":
            return self._do(what, key, lambda: call(*args, **kwargs))
        deadline = OPERATION_DEADLINE_S + body / MIN_UPLOAD_RATE
        end = time.monotonic() + deadline
        policy = replace(self.retry, budget=min(self.retry.budget, deadline))
        per_try = body_deadline(body) if body else deadline  # a request with a body: its own deadline as well

        def attempt() -> T:
            # timeout 0 would mean none to fsspec: a spent deadline still gets a millisecond, then expires
            return call(*args, **kwargs, timeout=max(min(end - time.monotonic(), per_try), 1e-3))

        return self._do(what, key, attempt, policy)

    def _first_contact(self) -> None:
        """Before this process's first request to the endpoint: one HEAD of the bucket within PROBE_TIMEOUT_S.
        Any answer, an error status included, means reachable; no answer is StoreUnreachable, naming the
        endpoint, instead of the whole retry budget followed by botocore's traceback."""
        bucket_id = self._bucket_id()
        if bucket_id in _REACHED:
            return
        bucket = bucket_id[1]
        endpoint = self.endpoint or "the default AWS endpoint (no storage.endpoint_url or AWS_ENDPOINT_URL set)"
        try:
            fsspec.asyn.sync(self.fs.loop, self.fs._call_s3, "head_bucket", Bucket=bucket, timeout=PROBE_TIMEOUT_S)
        except FSTimeoutError:
            raise StoreUnreachable(
                f"S3 endpoint {endpoint} did not answer within {PROBE_TIMEOUT_S} s (store {self.uri('')})"
            ) from None
        except Exception as e:
            if type(e).__name__ == "NoCredentialsError":  # botocore's: found before any request is sent
                raise StoreError(
                    f"S3 store {self.uri('')}: no credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE, or an instance role)"
                ) from None
            if not answered(e) and is_transient(e):
                reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                raise StoreUnreachable(
                    f"S3 endpoint {endpoint} cannot be reached (store {self.uri('')}): {reason}"
                ) from None
        _REACHED.add(bucket_id)

    def path(self, key: str) -> str:
        """The key's path under the root. A key with a '..' segment would leave the store: refused, whatever
        validated the names it was built from."""
        if ".." in key.split("/"):
            raise StoreError(f"key {key!r} leaves the store {self.uri('')}")
        return f"{self.root}/{key.strip('/')}" if key else self.root

    def uri(self, key: str) -> str:
        return f"{self.protocol}://{self.path(key)}"

    def key_of(self, uri: str) -> str | None:
        """The key of a URI (or a local path, for a file store) inside this store; None when it is outside."""
        if "://" not in uri and self.protocol == "file":
            uri = f"file://{os.path.abspath(uri)}"
        root = self.uri("")
        if uri.rstrip("/") == root:
            return ""
        return uri.removeprefix(root + "/").strip("/") if uri.startswith(root + "/") else None

    def exists(self, key: str) -> bool:
        return self._ask("exists", key, self.fs.exists, self.path(key))

    def read_bytes(self, key: str) -> bytes:
        return self._ask("read", key, self.fs.cat_file, self.path(key))

    def write_bytes(self, key: str, data: bytes) -> None:
        if self.protocol == "file":
            # Write-then-rename: a process killed mid-write leaves a stray temp file, never a torn manifest,
            # report or lease. (An S3 PUT is atomic per object already.)
            target = Path(self.path(key))
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}-{random.getrandbits(32):08x}")
            tmp.write_bytes(data)
            os.replace(tmp, target)
            return
        # the small objects of a run (reports, manifests, leases, step logs, Prefect's results): one deadline for
        # the whole operation, so an endpoint that trickles its answer costs seconds, not every attempt's body
        # deadline under the retry budget
        self._ask("write", key, self.fs.pipe_file, self.path(key), data, body=len(data))

    def put_file(self, local: str | Path, key: str) -> Upload | None:
        """Upload a file; return what was sent (its sha256, hashed on the way) when this store hashed it.

        file://: copied in one pass that hashes, to a temp name then renamed (a kill leaves no torn file).
        s3, below multipart_threshold: one PUT carrying ChecksumSHA256, so a server that validates checksums
        (AWS S3, MinIO) rejects bytes that arrive damaged, and keeps the hash for `stat_sha256`.
        s3, larger: a multipart upload with a SHA-256 per part (see _put_multipart), checked at once."""
        local = Path(local)
        if self.protocol == "file":
            return Upload(self._do("upload", key, lambda: copy_hashing(local, Path(self.path(key)), atomic=True)))
        if self.protocol != "s3":
            self._do("upload", key, lambda: self.fs.put_file(str(local), self.path(key)))
            return None
        if local.stat().st_size >= self.multipart_threshold:
            return self._do("upload", key, lambda: self._put_multipart(local, key))
        data = local.read_bytes()
        digest = hashlib.sha256(data)
        bucket, obj = self.path(key).split("/", 1)
        self._do(
            "upload",
            key,
            lambda: self.fs.call_s3(
                "put_object",
                Bucket=bucket,
                Key=obj,
                Body=data,
                timeout=body_deadline(len(data)),
                ChecksumAlgorithm="SHA256",
                ChecksumSHA256=b64(digest),
            ),
        )
        return Upload(digest.hexdigest())

    def _put_multipart(self, local: Path, key: str) -> Upload:
        """A multipart upload (artifacts/transfer.py), then the server's composite checksum compared with ours:
        `verified` says whether it matched."""
        bucket, obj = self.path(key).split("/", 1)
        part_size = max(self.part_size, -(-local.stat().st_size // 10_000))  # S3 allows 10,000 parts
        sent, composite = put_multipart(self.fs, bucket, obj, local, part_size, body_deadline)
        server = self.stat_checksum(key)[1] or ""
        return Upload(sent, verified=server.split("-")[0] == composite)

    def get_file(self, key: str, local: str | Path) -> str | None:
        """Download to local; return the sha256 (hex) of the bytes received when hashed on the way (file://: one
        pass that copies and hashes), else None (s3: s3fs's own concurrent ranged download, measured faster here
        than hashing ranges as they land, because moto copies the whole object for every ranged GET)."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        if self.protocol == "file":
            return self._do("download", key, lambda: copy_hashing(Path(self.path(key)), local, atomic=False))
        self._do("download", key, lambda: self.fs.get_file(self.path(key), str(local)))
        return None

    def size(self, key: str) -> int:
        return int(self._ask("stat", key, self.fs.info, self.path(key))["size"])

    def stat_checksum(self, key: str) -> tuple[int, str | None]:
        """(size, the server's ChecksumSHA256 as stored: base64, '-N' appended for a multipart composite) in one
        request; None on file:// or when the server keeps none."""
        if self.protocol != "s3":
            return self.size(key), None
        bucket, obj = self.path(key).split("/", 1)
        head = self._ask("head", key, self.fs.call_s3, "head_object", Bucket=bucket, Key=obj, ChecksumMode="ENABLED")
        return int(head["ContentLength"]), head.get("ChecksumSHA256")

    def stat_sha256(self, key: str) -> tuple[int, str | None]:
        """(size, the server's whole-object SHA-256 in hex, or None): the hash is there when the object was PUT
        with a ChecksumSHA256 in one request, never for a multipart composite, on file://, or with
        CASCADE_VERIFY_UPLOADS=reread."""
        size, value = self.stat_checksum(key)
        if self.verify_by_reread or not value or "-" in value or self.protocol != "s3":
            return size, None
        return size, base64.b64decode(value).hex()

    def sha256(self, key: str, block: int = 8 << 20) -> str:
        """Hash the stored bytes by reading them back (what the server or disk really holds)."""

        def read() -> str:
            h = hashlib.sha256()
            with self.fs.open(self.path(key), "rb", block_size=block) as f:
                for chunk in iter(lambda: f.read(block), b""):
                    h.update(chunk)
            return h.hexdigest()

        return self._do("re-read", key, read)

    def list(self, prefix: str) -> list[str]:
        """Keys of every file under prefix (recursive), relative to the root."""
        base = self.path(prefix)
        if not self.exists(prefix):
            return []
        found = self._ask("list", prefix, self.fs.find, base)
        return sorted(p[len(self.root) + 1 :] for p in found)

    def sizes(self, prefix: str) -> dict[str, int]:
        """Size of every file under prefix, keyed relative to prefix: one listing instead of a HEAD per file."""
        if not self.exists(prefix):
            return {}
        base = self.path(prefix)
        found = self._ask("list", prefix, self.fs.find, base, detail=True)
        return {name[len(base) + 1 :]: int(info["size"]) for name, info in found.items() if info["type"] == "file"}

    def list_dirs(self, prefix: str) -> list[str]:
        base = self.path(prefix)
        if not self.exists(prefix):
            return []
        entries = self._ask("list", prefix, self.fs.ls, base, detail=True)
        return sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "directory")

    def delete(self, key: str) -> None:
        if self.exists(key):
            self._ask("delete", key, self.fs.rm, self.path(key), recursive=True)

    def invalidate(self) -> None:
        """Forget cached listings (s3fs caches them) so another writer's objects become visible, and a failure
        of the endpoint, so the next operation tries it again."""
        self.fs.invalidate_cache()
        if self.protocol == "s3":
            _FAILING.pop(self._bucket_id(), None)
