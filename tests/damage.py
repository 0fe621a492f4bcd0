"""Damaged caches for tests: bytes changed in place, temp folders left by killed processes or long ago."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

from midlens.core.files import MANIFEST, OWNER


def overwrite(path: Path, offset: int, data: bytes) -> None:
    """Change bytes in place, same size: what a bad disk or a stray write does."""
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def tensor_offset(path: Path, name: str) -> int:
    """Byte offset of tensor `name`'s data in a safetensors file (8-byte header length, JSON header, data)."""
    raw = path.read_bytes()
    header_len = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + header_len])
    return 8 + header_len + header[name]["data_offsets"][0]


def poison(path: Path, tensor: str) -> None:
    """Set the first float32 of `tensor` to NaN."""
    overwrite(path, tensor_offset(path, tensor), struct.pack("<f", float("nan")))


def rot(path: Path, tensor: str) -> None:
    """`poison` as bit rot does it: the bytes change beneath the file system, so no stat shows it. A write through
    the file system always changes the ctime, so the manifest's recorded stat is made to match the file's new one."""
    poison(path, tensor)
    manifest_path = path.parent / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    st = path.stat()
    manifest["files"][path.name].update(mtime_ns=st.st_mtime_ns, inode=st.st_ino, ctime_ns=st.st_ctime_ns)
    manifest_path.write_text(json.dumps(manifest))


def dead_owner(folder: Path) -> None:
    """Make `folder`'s owner record name a process that has exited (a conversion or build killed mid-way)."""
    finished = subprocess.Popen(["true"])
    finished.wait()
    (folder / OWNER).write_text(json.dumps({"pid": finished.pid, "host": socket.gethostname(), "start": None}))


def age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))
