"""Moving bytes while hashing them: a file's sha256, a copy that hashes as it goes (atomic by a temp name), the
base64 form S3 checksums take, and an S3 multipart upload with a SHA-256 per part. artifacts/store.py decides
when each is used; nothing here knows about keys, retries or deadlines beyond the one it is given.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Files from this size up go as multipart uploads with a checksum per part (parallel parts; no whole file in
# memory); smaller ones as one PUT, which measured faster on moto for a 64 MiB file (3.3 s vs 3.8 s, loaded).
# S3 parts must be >= 5 MiB (the last one excepted).
MULTIPART_THRESHOLD = 100 * 2**20
PART_SIZE = 16 * 2**20
PARTS_IN_FLIGHT = 4


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def copy_hashing(src: Path, dst: Path, atomic: bool) -> str:
    """Copy src to dst in one pass that also hashes; with atomic, via a temp name renamed into place."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    target = dst.with_name(f".{dst.name}.tmp-{os.getpid()}-{random.getrandbits(32):08x}") if atomic else dst
    h = hashlib.sha256()
    try:
        with open(src, "rb") as fin, open(target, "wb") as fout:
            for block in iter(lambda: fin.read(4 << 20), b""):
                h.update(block)
                fout.write(block)
        if atomic:
            os.replace(target, dst)
    finally:
        if atomic and target.exists():
            target.unlink()
    return h.hexdigest()


def b64(digest: Any) -> str:
    """base64 of a hashlib object's digest, or of raw digest bytes: the form S3 checksums take."""
    return base64.b64encode(digest if isinstance(digest, bytes) else digest.digest()).decode()


@dataclass(frozen=True)
class Upload:
    """What put_file sent: the sha256 (hex) of the bytes, and whether the server's checksum of the bytes it
    received was already compared with ours during the upload (multipart composite)."""

    sha256: str
    verified: bool = False


def put_multipart(
    fs: Any, bucket: str, obj: str, local: Path, part_size: int, deadline: Callable[[int], float]
) -> tuple[str, str]:
    """Parts read and hashed in order (the whole file's sha256 and each part's) while up to PARTS_IN_FLIGHT
    parts upload, each with its ChecksumSHA256 (AWS rejects a damaged part; moto recomputes the composite
    from the bytes it received). Afterwards the server's composite checksum (sha256 of the part digests)
    is compared with ours (the caller's part): returns (the file's sha256 hex, our composite, as S3 writes it).
    A failed upload is aborted. `deadline(bytes)`: the time limit of one part's request."""
    upload_id = fs.call_s3("create_multipart_upload", Bucket=bucket, Key=obj, ChecksumAlgorithm="SHA256")["UploadId"]
    whole, digests, parts, window = hashlib.sha256(), [], [], deque()
    ids = {"Bucket": bucket, "Key": obj, "UploadId": upload_id}

    def drain(keep: int) -> None:
        while len(window) > keep:
            number, digest, fut = window.popleft()
            parts.append({"PartNumber": number, "ETag": fut.result()["ETag"], "ChecksumSHA256": b64(digest)})

    try:
        with open(local, "rb") as f, ThreadPoolExecutor(PARTS_IN_FLIGHT) as pool:
            for number, block in enumerate(iter(lambda: f.read(part_size), b""), 1):
                whole.update(block)
                digest = hashlib.sha256(block)
                digests.append(digest.digest())
                window.append(
                    (
                        number,
                        digest,
                        pool.submit(
                            fs.call_s3,
                            "upload_part",
                            **ids,
                            PartNumber=number,
                            Body=block,
                            timeout=deadline(len(block)),
                            ChecksumAlgorithm="SHA256",
                            ChecksumSHA256=b64(digest),
                        ),
                    )
                )
                drain(PARTS_IN_FLIGHT - 1)  # bounded memory: at most PARTS_IN_FLIGHT parts held
            drain(0)
        fs.call_s3("complete_multipart_upload", **ids, MultipartUpload={"Parts": parts})
    except BaseException:
        try:
            fs.call_s3("abort_multipart_upload", **ids)
        except Exception:  # the server may be the reason we are here; its lifecycle rules clean up
            pass
        raise
    return whole.hexdigest(), b64(hashlib.sha256(b"".join(digests)))
