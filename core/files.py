"""Files midlens writes or trusts: the cache root, hashes, and writes that are atomic (temp file + rename)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from tqdm.auto import tqdm


def cache_dir() -> Path:
    """Root of midlens' caches; `MIDLENS_CACHE` overrides it."""
    root = os.environ.get("MIDLENS_CACHE") or Path.home() / ".cache" / "midlens"
    return Path(root)


def sha256_of(paths: list[Path], progress: str | None = None) -> str:
    """One sha256 over the bytes of `paths` in order (a GGUF split in parts hashes as the joined file)."""
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc=progress, disable=progress is None) as bar:
        for path in paths:
            with path.open("rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    bar.update(len(chunk))
    return digest.hexdigest()


def sha256_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only be read by setting it, which would
    race with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)  # no /proc (not Linux): the set-and-restore fallback
    os.umask(umask)
    return umask


def write_atomic(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results and reports are meant to be shared
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
