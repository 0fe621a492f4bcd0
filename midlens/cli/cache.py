"""`midlens cache`: see, verify and clear what midlens keeps on disk (converted models, retrieval indexes).

    midlens cache info                                  models and indexes, sizes, paths, leftover temp folders
    midlens cache verify [--model NAME] [--dtype D]     every file against its recorded sha256; each model's
                                                        load-time comparison with transformers' forward, again
    midlens cache clear (--model NAME | --indexes | --all)   a model goes with its load-time check records

Listing and clearing read only the folders (no torch, no faiss), so they answer at once; verifying hashes
every byte. The folder helpers here serve `midlens index` too.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from midlens.cli.options import cli_message
from midlens.core.errors import MidlensError
from midlens.core.files import (
    folder_size,
    indexes_dir,
    is_stale,
    load_checks_dir,
    models_dir,
    read_manifest,
    remove_tree,
)


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def entries(parent: Path, hidden: bool) -> list[Path]:
    if not parent.is_dir():
        return []
    return sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink() and p.name.startswith(".") == hidden)


def _model_state(folder: Path) -> str:
    try:
        manifest = read_manifest(folder)
    except ValueError:
        return "MANIFEST.json unreadable: `midlens cache verify` says more"
    if manifest is None:
        return "unverified: no manifest (converted again from its GGUF on next load)"
    return f"{len(manifest['files'])} files in manifest, recorded {manifest.get('recorded', '?')}"


def _index_meta(folder: Path) -> dict:
    try:
        return json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def index_line(folder: Path, detail: bool) -> str:
    meta = _index_meta(folder)
    if not meta:
        return f"  {folder.name}  {human(folder_size(folder))}  meta.json missing or unreadable (clear and rebuild)"
    line = (
        f"  {folder.name}  {human(folder_size(folder))}  {meta.get('passages', '?')} passages, "
        f"{meta.get('index_type', '?')}, {meta.get('embedding_model', '?')}"
    )
    if detail:
        line += f"\n      corpus: {meta.get('source', 'not recorded (built before midlens recorded it)')}"
        line += f"\n      chunks: {meta.get('chunk_words', '?')} words, {meta.get('overlap_words', '?')} overlap"
    return line + f"\n      {folder}"


def _leftover_state(folder: Path) -> str:
    if ".embeddings-" in folder.name:
        return "embedding shards of an interrupted index build (the next build of that corpus resumes from them)"
    if is_stale(folder):
        return "left by an interrupted run; removed on the next run"
    return "in use by a running conversion or build"


def print_leftovers(folders: list[Path]) -> None:
    if folders:
        print("unfinished work (temp folders):")
        for f in folders:
            print(f"  {f}  {human(folder_size(f))}  {_leftover_state(f)}")


def run_info(args: argparse.Namespace) -> int:
    models, indexes = entries(models_dir(), False), entries(indexes_dir(), False)
    leftovers = entries(models_dir(), True) + entries(indexes_dir(), True)
    print(f"midlens cache: {models_dir().parent} (set MIDLENS_CACHE to move it)")
    print(f"models ({len(models)}):" if models else "models: none converted yet")
    for folder in models:
        print(f"  {folder.name}  {human(folder_size(folder))}  {_model_state(folder)}\n      {folder}")
    print(f"retrieval indexes ({len(indexes)}):" if indexes else "retrieval indexes: none built yet")
    for folder in indexes:
        print(index_line(folder, detail=False))
    print_leftovers(leftovers)
    print(_load_checks_line())
    total = sum(folder_size(f) for f in models + indexes + leftovers) + _folder_bytes(load_checks_dir())
    print(f"total {human(total)}")
    return 0


def _verify_index(folder: Path) -> str | None:
    """What is wrong with an index folder (every file hashed against its manifest), None when nothing is."""
    from midlens.core.errors import RetrievalIndexError
    from midlens.retrievers.dense import verify_index

    try:
        verify_index(folder, hashes=True)
    except RetrievalIndexError as err:
        return cli_message(err)
    return None


def run_verify(args: argparse.Namespace) -> int:
    from midlens.core.errors import ModelError
    from midlens.generators.models.model_cache import check_model_folder

    if args.model:
        folder = models_dir() / _plain_name(args.model)
        if not folder.is_dir():
            raise ModelError(f"no cached model '{args.model}' in {models_dir()}; {_cached_models_hint()}")
        models, indexes = [folder], []
    else:
        models, indexes = entries(models_dir(), False), entries(indexes_dir(), False)
    bad = 0
    for folder in models:
        try:
            check_model_folder(folder.name, folder, hashes=True)
        except ModelError as err:
            bad += 1
            print(f"DAMAGED model {folder.name}: {cli_message(err)}\n")
            continue
        print(f"ok      model {folder.name}: every file matches its manifest ({folder})")
        bad += _recheck(folder, getattr(args, "dtype", "auto"))
    for folder in indexes:
        problem = _verify_index(folder)
        if problem:
            bad += 1
            print(f"DAMAGED index {folder.name}: {problem}\n")
        else:
            print(f"ok      index {folder.name}: every file matches its manifest ({folder})")
    if not models and not indexes:
        print(f"nothing cached under {models_dir().parent}")
    return 1 if bad else 0


def _recheck(folder: Path, dtype: str) -> int:
    """Run the load-time comparison with transformers' forward again (generators/models/transformers_parity.py); 1 when
    refused. Its record is forgotten first, so the load measures (this command runs in a process of its own: a model an
    embedding process already holds would keep its earlier result)."""
    from midlens.core.errors import ModelError
    from midlens.generators.models import transformers_parity
    from midlens.generators.models.loading import load_model, release_model
    from midlens.generators.models.packaged_models import REGISTRY

    transformers_parity.forget(folder)
    try:
        loaded = load_model(folder.name if folder.name in REGISTRY else str(folder), "auto", dtype)
    except ModelError as err:
        print(f"REFUSED model {folder.name}: {cli_message(err)}\n")
        return 1
    release_model(loaded)
    if loaded.verified is None or not loaded.verified.judged:
        print(f"?       model {folder.name}: not compared (transformers' own logits are not finite)")
        return 1
    measured = loaded.verified.describe()
    print(f"ok      model {folder.name}: midlens' attention matches transformers' forward, {measured}")
    return 0


def _plain_name(name: str) -> str:
    """A cache entry name, refused when it could point outside the cache (a path, '..', a hidden name)."""
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise MidlensError(f"--model {name!r}: give a cached model's name, as `midlens cache info` lists it.")
    return name


def _check_records() -> list[Path]:
    folder = load_checks_dir()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def _folder_bytes(folder: Path) -> int:
    return folder_size(folder) if folder.is_dir() else 0


def _load_checks_line() -> str:
    """How many load-time comparisons are on record and how many refused, read from the records alone."""
    records = _check_records()
    if not records:
        return "load-time checks: none recorded yet (the first load of each model and dtype runs one)"
    refused = 0
    for record in records:
        try:
            refused += not json.loads(record.read_text(encoding="utf-8"))["check"]["passed"]
        except (OSError, ValueError, KeyError, TypeError):
            refused += 1  # an unreadable record is not a pass: the next load runs the comparison again
    return (
        f"load-time checks: {len(records)} recorded, {refused} refused or unreadable  {load_checks_dir()}\n"
        "      (`midlens cache verify --model NAME` runs one again)"
    )


def _model_checks(folder: Path) -> list[Path]:
    """The records of one cached model (any dtype, device or version): those made from its folder."""
    ours = []
    for record in _check_records():
        try:
            made_from = json.loads(record.read_text(encoding="utf-8"))["check"]["folder"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if Path(str(made_from)).resolve() == folder.resolve():
            ours.append(record)
    return ours


def _clear_checks(records: list[Path]) -> int:
    freed = 0
    for record in records:
        freed += record.stat().st_size
        record.unlink(missing_ok=True)
    if records:
        print(f"removed {len(records)} load-time check record(s) from {load_checks_dir()}")
    return freed


def _cached_models_hint() -> str:
    names = [f.name for f in entries(models_dir(), False)]
    return f"cached models: {', '.join(names)}." if names else "no model is cached."


def _clear(folders: list[Path], what: str) -> int:
    freed = 0
    for folder in folders:
        size = folder_size(folder)
        remove_tree(folder)
        freed += size
        print(f"removed {what} {folder} ({human(size)})")
    return freed


def _clear_leftovers(parent: Path, prefix: str = ".") -> int:
    """Temp folders are removed unless a live process is still writing them."""
    freed = 0
    for folder in entries(parent, True):
        if not folder.name.startswith(prefix):
            continue
        if ".embeddings-" not in folder.name and not is_stale(folder):
            print(f"kept {folder}: a running conversion or build is writing it")
            continue
        freed += folder_size(folder)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"removed unfinished {folder}")
    return freed


def clear_indexes() -> int:
    return _clear(entries(indexes_dir(), False), "index") + _clear_leftovers(indexes_dir())


def run_clear(args: argparse.Namespace) -> int:
    freed = 0
    if args.model:
        folder = models_dir() / _plain_name(args.model)
        if folder.is_dir():
            freed += _clear_checks(_model_checks(folder))
            freed += _clear([folder], "model")
            print(f"the next run that uses {args.model} converts it again from its installed GGUF")
        else:
            print(f"nothing to clear: no cached model '{args.model}' in {models_dir()}; {_cached_models_hint()}")
        freed += _clear_leftovers(models_dir(), f".{args.model}-")
    if args.indexes or args.all:
        freed += clear_indexes()
    if args.all:
        freed += _clear(entries(models_dir(), False), "model") + _clear_leftovers(models_dir())
        freed += _clear_checks(_check_records())
        if load_checks_dir().is_dir():
            shutil.rmtree(load_checks_dir(), ignore_errors=True)  # and the weights-hash memos beside the records
    print(f"freed {human(freed)}")
    return 0


def add_parser(sub) -> None:
    cache = sub.add_parser("cache", help="converted models and retrieval indexes on disk: info, verify, clear")
    actions = cache.add_subparsers(dest="cache_command", required=True)
    info = actions.add_parser("info", help="list cached models and indexes with their sizes and paths")
    info.set_defaults(func=run_info)
    verify = actions.add_parser(
        "verify",
        help="check every cached file against its recorded sha256, and run each model's load-time comparison with "
        "transformers' own forward again",
    )
    verify.add_argument("--model", help="verify only this cached model (default: every model and index)")
    verify.add_argument(
        "--dtype", default="auto", help="the dtype the models' comparison runs in (default: what loading uses)"
    )
    verify.set_defaults(func=run_verify)
    clear = actions.add_parser("clear", help="delete a cached model (converted again on next use) or the indexes")
    which = clear.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="the cached model to delete, e.g. smollm2-135m")
    which.add_argument("--indexes", action="store_true", help="delete every retrieval index")
    which.add_argument(
        "--all", action="store_true", help="delete every cached model and index, and the load-time check records"
    )
    clear.set_defaults(func=run_clear)
