"""Files midlens writes or trusts: the cache root, hashes, writes that are atomic (temp file + rename),
manifests that record what a folder held when it was written, and temp folders a later run can sweep."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout
from tqdm.auto import tqdm

from midlens.core.errors import InvalidArgumentError


def cache_dir() -> Path:
    """Root of midlens' caches; `MIDLENS_CACHE` overrides it."""
    root = os.environ.get("MIDLENS_CACHE") or Path.home() / ".cache" / "midlens"
    return Path(root)


def models_dir() -> Path:
    """Converted registry models, one folder per name."""
    return cache_dir() / "models"


def indexes_dir() -> Path:
    """Retrieval indexes, one folder per corpus fingerprint."""
    return cache_dir() / "indexes"


def load_checks_dir() -> Path:
    """The load-time comparisons with transformers' forward, one JSON record per (weights, config, dtype, device,
    versions); a missing record only costs the comparison again."""
    return cache_dir() / "load-checks"


def make_folder(folder: Path) -> Path:
    """`folder` made (with its parents) to write into. A file where a folder must be (an output `results.txt`, or a
    parent that is a file) is refused by name, not by mkdir's FileExistsError traceback."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder)
        raise InvalidArgumentError(
            f"cannot write into {folder}: {blocking} is a file, and a folder is needed there. Give a folder path "
            f"(an output folder is created when missing), or move {blocking} out of the way."
        ) from None
    return folder


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Held while this process builds `target` (a model conversion, an index).

    Two processes started together (two eval shards, a demo beside a CLI run) would otherwise both build it,
    and the first to finish removes the working files the second is still writing. With the lock the second
    waits, then finds the folder built and reuses it. The lock file stays (hidden, empty): deleting it on
    release would let a third process lock a different file of the same name."""
    make_folder(target.parent)
    lock = FileLock(target.with_name(f".{target.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process that is building {target} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


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
    make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results and reports are meant to be shared
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- verified folders: a manifest of every file's size and sha256 -----------------------------------------------

MANIFEST = "MANIFEST.json"
PROGRESS_FROM = 1 << 26  # hashing smaller files takes well under a second: no bar for them


def _progress_for(path: Path, progress: str | None) -> str | None:
    return f"{progress}: {path.name}" if progress and path.stat().st_size >= PROGRESS_FROM else None


def _stat_of(path: Path) -> dict:
    """What changes when a file's bytes are written: size, modification time (ns), inode (a replaced file) and
    change time (ns). The mtime can be set back after a write (`touch -r`, `os.utime`, a copy tool keeping
    times); the ctime cannot (setting the mtime sets it), so an edit that keeps size and mtime still shows.
    What no stat shows is bytes changed beneath the file system (bit rot, a raw block write)."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "ctime_ns": st.st_ctime_ns}


STAT_KEYS = ("mtime_ns", "inode", "ctime_ns")


def write_manifest(folder: Path, extra: dict | None = None, progress: str | None = None) -> dict:
    """Record the size, sha256 and stat (mtime_ns, inode) of every file under `folder` (the manifest itself aside)
    in MANIFEST.json. Call it right after a verified write: the stat lets a later load skip re-hashing files
    nothing has touched since, and re-hash any file something has."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(folder).as_posix()] = {
            **_stat_of(path),
            "sha256": sha256_of([path], progress=_progress_for(path, progress)),
        }
    manifest = {"format": 2, **(extra or {}), "files": files}
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, None when it has none; ValueError when MANIFEST.json cannot be read as one."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        entries = manifest["files"].values()
        well_formed = all(isinstance(e["size"], int) and isinstance(e["sha256"], str) for e in entries)
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a readable manifest ({type(err).__name__}: {err})") from None
    if not well_formed:
        raise ValueError(f"{path} is not a readable manifest (an entry lacks an integer size or a sha256)")
    return manifest


def record_in_manifest(folder: Path, names: list[str]) -> dict:
    """Record the size and sha256 of the files `names` (in `folder`) in its MANIFEST.json, keeping the entries of
    its other files: for a folder whose files are written one at a time (slot orders, retrieval-head scores), each
    verified by its own entry. No stat is recorded (these files are small: a reader hashes them at every read), so
    a shipped manifest says nothing of the machine it was written on. Under a lock beside the manifest, so two
    writers into one folder keep both entries."""
    with FileLock(folder / f".{MANIFEST}.lock"):
        manifest = read_manifest(folder) or {"format": 2, "files": {}}
        for name in names:
            path = folder / name
            manifest["files"][name] = {"size": path.stat().st_size, "sha256": sha256_of([path])}
        write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


@dataclass(frozen=True)
class FileProblem:
    """One file that does not match its manifest entry."""

    path: Path
    what: str

    def __str__(self) -> str:
        return f"{self.path}: {self.what}"


def manifest_problems(
    folder: Path,
    manifest: dict,
    hashes: bool,
    progress: str | None = None,
    always_hash: tuple[str, ...] = (),
) -> list[FileProblem]:
    """Files under `folder` that differ from `manifest`. Sizes always; sha256 of every file when `hashes`, else of
    the files named in `always_hash` and of those whose stat (mtime_ns, inode, ctime_ns) differs from the recorded
    one, so an unchanged folder costs one stat per file and any write through the file system, even one that keeps
    the size and sets the mtime back, is caught. A file whose bytes still match gets its new stat recorded (the
    manifest is rewritten atomically), so it is hashed once, not at every load."""
    problems = []
    refreshed = False
    for rel, entry in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            problems.append(FileProblem(path, "missing"))
            continue
        stat = _stat_of(path)
        if stat["size"] != entry["size"]:
            problems.append(FileProblem(path, f"{stat['size']} bytes, the manifest records {entry['size']}"))
            continue
        touched = any(entry.get(key) != stat[key] for key in STAT_KEYS)
        if hashes or touched or rel in always_hash:
            actual = sha256_of([path], progress=_progress_for(path, progress))
            if actual != entry["sha256"]:
                problems.append(FileProblem(path, f"sha256 {actual}, the manifest records {entry['sha256']}"))
            elif touched:
                entry.update(stat)
                refreshed = True
    if refreshed and not problems:
        try:
            write_atomic(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only cache: the files were verified all the same, the next load hashes them again
    return problems


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


# -- temp folders: owned by a process, swept when their owner is gone --------------------------------------------

OWNER = ".midlens-owner"
STALE_AFTER_S = 3600.0


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a live owner from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def make_temp_dir(parent: Path, prefix: str) -> Path:
    """A fresh hidden temp folder in `parent` that records its owner (pid, host, start time), so a later run
    can tell a folder left by a killed process from one still being written."""
    make_folder(parent)
    work = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "start": _process_start(os.getpid())}
    (work / OWNER).write_text(json.dumps(owner))
    return work


@contextmanager
def replacing_folder(folder: Path) -> Iterator[Path]:
    """A temp folder beside `folder` to fill; when the block ends it replaces `folder` in one rename (readers
    see the old folder or the new one, never half of either), and when the block raises it is removed."""
    work = make_temp_dir(folder.parent, f".{folder.name}-")
    try:
        yield work
        (work / OWNER).unlink(missing_ok=True)
        if folder.exists():
            remove_tree(folder)
        os.replace(work, folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def _owner_alive(folder: Path) -> bool | None:
    """True/False when the owner is known and on this host; None when it cannot be told (no or foreign owner)."""
    try:
        owner = json.loads((folder / OWNER).read_text())
        pid, host, start = int(owner["pid"]), owner["host"], owner.get("start")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return start is None or _process_start(pid) in (None, start)


def is_stale(folder: Path, max_age_s: float = STALE_AFTER_S) -> bool:
    """A temp folder whose owner is gone, or, when its owner cannot be told, untouched for `max_age_s`."""
    alive = _owner_alive(folder)
    if alive is not None:
        return not alive
    try:
        return time.time() - folder.stat().st_mtime > max_age_s
    except OSError:
        return False  # already removed by someone else


def remove_tree(folder: Path) -> None:
    """Delete a folder so that no reader ever sees it half-deleted: rename it to a hidden sibling, then remove."""
    trash = folder.with_name(f".{folder.name}-deleting-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.replace(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def sweep_stale(parent: Path, match: Callable[[str], bool], max_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the hidden temp folders in `parent` whose names `match` and that are stale; returns them."""
    removed = []
    if not parent.is_dir():
        return removed
    for entry in parent.iterdir():
        if entry.name.startswith(".") and match(entry.name) and entry.is_dir() and not entry.is_symlink():
            if is_stale(entry, max_age_s):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed
