"""Files a user names (a recipe, eval or SFT data, a benchmark's rows), opened so that no read waits forever.

A path or `file://` URL may name a FIFO, whose open for reading waits for a writer forever, or a device such as
/dev/zero, whose reads never end. Only a regular file is opened: its type is read with stat, which opens nothing,
and again from the descriptor, opened non-blocking, so a FIFO put in its place between the two is refused as well.
A read with a bound stops one byte past it. Other schemes (s3://, hf://) are fsspec's.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.compression import compr
from fsspec.utils import infer_compression

FILE_TYPES = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


class UnreadableFile(OSError):
    """A user's file that is missing, not a regular file, unreadable or past its bound; the message is one line
    naming it as the user did."""


def local_path(location: str | Path) -> str | None:
    """The local path a plain path or `file://` URL names; None for any other scheme."""
    text = str(location)
    if text.startswith("file://"):
        return text.removeprefix("file://")
    return None if "://" in text else text


def check_user_file(location: str | Path, what: str = "data file") -> str | None:
    """The local path `location` names, once stat finds a regular file there; None for a remote URL, which is
    not checked here. `what` names the file in the error: `<what> not found: <location>`,
    `<what> <location> is not a regular file (a FIFO)`, `cannot read <what> <location>: <reason>`."""
    path = local_path(location)
    if path is not None:
        _refuse_unless_regular(_stat(path, location, what).st_mode, location, what)
    return path


def _stat(path: str, location: str | Path, what: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise UnreadableFile(f"{what} not found: {location}") from None
    except OSError as e:
        raise UnreadableFile(f"cannot read {what} {location}: {e.strerror}") from None


def _refuse_unless_regular(mode: int, location: str | Path, what: str) -> None:
    if not stat.S_ISREG(mode):
        kind = FILE_TYPES.get(stat.S_IFMT(mode), "a special file")
        raise UnreadableFile(f"{what} {location} is not a regular file ({kind})")


def open_regular(path: str | Path, follow_symlinks: bool = True) -> tuple[int | None, int]:
    """(descriptor, st_mode) of `path` opened for reading where it is a regular file, the descriptor blocking again;
    (None, st_mode) with nothing left open where it is anything else. Opened non-blocking, so a FIFO does not wait
    for a writer as a plain open would. OSError as os.open raises it (with follow_symlinks False: on a symlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        return None, mode
    os.set_blocking(fd, True)
    return fd, mode


@contextlib.contextmanager
def open_user_file(
    location: str | Path, what: str = "data file", compression: str | None = None, **storage_options: Any
) -> Iterator[IO[bytes]]:
    """A user's file opened for reading bytes: a local one only when it is a regular file (check_user_file);
    a remote URL through fsspec with `storage_options`. compression "infer": decompressed as its name says (.gz)."""
    path = check_user_file(location, what)
    if path is None:
        with fsspec.open(str(location), "rb", compression=compression, **storage_options) as remote:
            yield remote
        return
    try:
        fd, mode = open_regular(path)  # again: a FIFO put here since the stat is refused, not waited on
    except OSError as e:
        raise UnreadableFile(f"cannot read {what} {location}: {e.strerror}") from None
    if fd is None:
        _refuse_unless_regular(mode, location, what)
    with os.fdopen(fd, "rb") as raw:
        codec = infer_compression(path) if compression == "infer" else compression
        if codec is None:
            yield raw
            return
        with compr[codec](raw, mode="rb") as decompressed:
            yield decompressed


def read_user_file(location: str | Path, limit: int, what: str = "data file") -> bytes:
    """All of a user's file, refused (UnreadableFile) once it holds more than `limit` bytes: at most limit + 1
    are read, whatever its size says (a file under /proc says 0)."""
    with open_user_file(location, what) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(f"{what} {location} is larger than {limit} bytes")
    return data
