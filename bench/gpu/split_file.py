"""A file in parts small enough to travel one or two at a time, and the parts joined again, every byte checked.

    python bench/gpu/split_file.py split FILE DIR MIB [MIB ...]   # parts of MIB MiB each, the rest in the last
    python bench/gpu/split_file.py join DIR DEST                  # DEST = the parts in order, checked

`split` writes DIR/part-00, part-01, ... and DIR/SHA256: the sha256 and size of each part and of the whole file.
`join` checks every part against SHA256 before it writes, and the joined file after: a missing or corrupt part
is one line (exit 2) naming it, and DEST is written only whole (a temp file, renamed once it verifies).
A lent GPU takes 64 MiB a call with the working tree; smollm2-135m's GGUF is 94 MiB (bench/gpu/check.sh).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

MIB = 1 << 20
MANIFEST = "SHA256"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def split(source: Path, out: Path, sizes_mib: list[int]) -> list[Path]:
    data = source.read_bytes()
    bounds = [0]
    for size in sizes_mib:
        bounds.append(min(bounds[-1] + size * MIB, len(data)))
    bounds.append(len(data))
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        name = f"part-{index:02d}"
        (out / name).write_bytes(data[start:end])
        parts.append({"name": name, "bytes": end - start, "sha256": sha256(data[start:end])})
    whole = {"name": source.name, "bytes": len(data), "sha256": sha256(data)}
    (out / MANIFEST).write_text(json.dumps({"file": whole, "parts": parts}, indent=1))
    return [out / p["name"] for p in parts]


def join(parts_dir: Path, dest: Path) -> None:
    manifest = json.loads((parts_dir / MANIFEST).read_text())
    chunks = []
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            raise ValueError(f"{path}: missing (carry it, then join again)")
        data = path.read_bytes()
        if len(data) != part["bytes"] or sha256(data) != part["sha256"]:
            raise ValueError(f"{path}: {len(data)} bytes, not the {part['bytes']} its sha256 was taken of")
        chunks.append(data)
    data = b"".join(chunks)
    if sha256(data) != manifest["file"]["sha256"]:
        raise ValueError(f"{parts_dir}: the joined parts do not hash to {manifest['file']['name']}'s sha256")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, dest)


def main(argv: list[str]) -> int:
    try:
        if len(argv) >= 3 and argv[0] == "split":
            for path in split(Path(argv[1]), Path(argv[2]), [int(s) for s in argv[3:]]):
                print(f"{path}: {path.stat().st_size / MIB:.1f} MiB")
        elif len(argv) == 3 and argv[0] == "join":
            join(Path(argv[1]), Path(argv[2]))
            print(f"{argv[2]}: joined and verified")
        else:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return 2
    except (OSError, ValueError, KeyError) as e:
        print(f"split_file: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
