"""Runs that survive being killed and split across machines.

A run directory holds `config.json` (everything that defines the run: data, seed, model, methods,
their hashes) and one results file per shard. Each finished unit appends one JSON line and is flushed,
so after a kill the run resumes at the first unit without a line; a half-written last line (killed
mid-write) is cut off first. `--shard i/n` takes the units of every n-th example (examples stay whole,
so a shard's table is meaningful on its own); `merge` joins shard files or run dirs into one results
file in the canonical unit order.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from pathlib import Path

from tqdm import tqdm

from midlens.core.errors import MidlensError, Remedy
from midlens.core.files import make_folder, sha256_json, write_atomic

RESULTS = "results.jsonl"
CONFIG = "config.json"
VOLATILE = ("seconds", "timings", "started", "shard", "worker", "extended")  # differ between runs of the same work
# What may differ when a run grows: started on n questions, it resumes on more. The datasets subsample by prefix, so
# the first n stay the same questions; that is checked against the hash the run recorded, not assumed.
EXTENDABLE = ("n", "examples", "data_sha256", "units")


class RunError(MidlensError):
    """A run directory that cannot be resumed or merged as asked."""


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise RunError("expected i/n, e.g. 0/4 (shards are numbered 0..n-1).", about=Remedy("shard", text)) from None
    if n < 1 or not 0 <= i < n:
        raise RunError("need n >= 1 and 0 <= i < n.", about=Remedy("shard", text))
    return i, n


def results_name(shard: tuple[int, int]) -> str:
    i, n = shard
    return RESULTS if n == 1 else f"results.shard-{i}-of-{n}.jsonl"


def read_rows(path: Path, repair: bool = False) -> list[dict]:
    """Rows of a results file (or its .gz, as results ship in docs/); a torn last line is dropped (and cut from
    the file when `repair`)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise RunError(f"{path}: not a readable gzip file ({err}); gunzip it to see what is left.") from None
        repair = False  # a shipped archive is read, never rewritten
    rows, good_end, start = [], 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end < 0:
            break  # no newline: the writer was killed mid-line
        line = data[start:end].strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                lineno = data[:start].count(b"\n") + 1
                raise RunError(
                    f"{path}: line {lineno} is not valid JSON; the file was edited or corrupted, not just interrupted."
                ) from None
        start = good_end = end + 1
    if repair and good_end < len(data):
        write_atomic(path, data[:good_end])
    return rows


def comparable(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in VOLATILE}


def prepare_dir(out: Path, config: dict, prefix_sha256: Callable[[int], str] | None = None) -> None:
    """Create the run dir, or check that an existing one was started with the same config.

    With `prefix_sha256` (the data hash of the first m examples of this config's data), a run started on fewer
    examples grows to this config's: its config is rewritten with the new size and the growth recorded, and the
    rows it holds stay (they are the same units of the same examples)."""
    path = out / CONFIG
    if not path.exists():
        write_atomic(path, json.dumps(config, indent=2, sort_keys=True) + "\n")
        return
    old = json.loads(path.read_text())
    if comparable(old) == comparable(config):
        return
    diff = sorted(k for k in set(old) | set(config) if k not in VOLATILE and old.get(k) != config.get(k))
    before, after = old.get("examples"), config.get("examples")
    if (
        set(diff) <= set(EXTENDABLE)
        and prefix_sha256 is not None
        and isinstance(before, int)
        and isinstance(after, int)
        and after != before
    ):
        if after < before:
            raise RunError(
                f"{out} holds a run on {before} examples; a run grows but does not shrink: repeat --n "
                f"{old.get('n')} to resume it (the report reads whatever rows it holds)."
            )
        if prefix_sha256(before) != old.get("data_sha256"):
            raise RunError(
                f"{out} holds a run on {before} examples that are not the first {before} of these {after} (their "
                "hash differs: the dataset file changed?); write to another folder to start a new run."
            )
        grown = {**config, "started": old.get("started"), "extended": [*old.get("extended", []), before]}
        write_atomic(path, json.dumps(grown, indent=2, sort_keys=True) + "\n")
        return
    raise RunError(
        f"{out} holds a run with a different configuration (differs in: {', '.join(diff)}); "
        "write to another folder to start a new run, or repeat the original options to resume it "
        "(a larger --n grows it)."
    )


def recorded_examples(out: Path) -> int | None:
    """How many examples the run in `out` was planned on (None: no run there yet, or one on a whole dataset)."""
    path = Path(out) / CONFIG
    if not path.exists():
        return None
    examples = json.loads(path.read_text()).get("examples")
    return examples if isinstance(examples, int) else None


def pending_units(
    out: Path,
    config: dict,
    units: list[dict],
    shard: tuple[int, int],
    limit: int | None,
    prefix_sha256: Callable[[int], str] | None = None,
) -> tuple[Path, list[dict], set[str], list[dict]]:
    """Prepare the run directory (growing it where `prefix_sha256` allows: `prepare_dir`) -> (results file, the
    shard's units, keys done, units to do, at most `limit`)."""
    out = Path(out)
    prepare_dir(out, config, prefix_sha256)
    path = out / results_name(shard)
    shipped = path.with_name(path.name + ".gz")
    if not path.exists() and shipped.exists():
        # A run as it ships in docs/ (rows gzipped) resumes where it stopped: its rows are unpacked to append to;
        # the archive stays, and readers count a unit in both once.
        write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in read_rows(shipped)))
    done = {row["key"] for row in read_rows(path, repair=True)}
    i, n = shard
    mine = [u for u in units if u["example"] % n == i]
    todo = [u for u in mine if u["key"] not in done]
    return path, mine, done, todo if limit is None else todo[:limit]


def run_units(
    out: Path,
    config: dict,
    units: list[dict],
    evaluate: Callable[[dict], dict],
    shard: tuple[int, int] = (0, 1),
    limit: int | None = None,
    progress: bool = True,
    evaluate_many: Callable[[list[dict]], list[dict]] | None = None,
    batch_size: int = 1,
    prefix_sha256: Callable[[int], str] | None = None,
) -> list[dict]:
    """Evaluate the shard's units not yet in its results file, appending one line each.

    Each unit carries "key" (unique), "order" (canonical position) and "example" (index for sharding);
    `limit` stops after that many new units (a bounded run, or a simulated interruption in tests).
    With `evaluate_many` and `batch_size` > 1, units go to it in groups of about `batch_size`: one method's
    units of whole examples at a time, so a group is one generator's batch; each row is still written (and
    a resumed run skips it) one unit at a time. `prefix_sha256` lets a run started on fewer examples grow
    (`prepare_dir`).
    """
    path, mine, done, todo = pending_units(out, config, units, shard, limit, prefix_sha256)
    batched = evaluate_many is not None and batch_size > 1
    groups = unit_groups(todo, batch_size) if batched else [[u] for u in todo]

    def rows():
        for group in groups:
            results = evaluate_many(group) if batched else [evaluate(group[0])]
            for unit, result in zip(group, results, strict=True):
                yield {**unit, **result}

    write_rows(path, config, rows(), len(mine), done, progress)
    return read_rows(path)


def write_rows(path: Path, config: dict, rows: Iterable[dict], total: int, done: set[str], progress: bool) -> int:
    """Append each row as it comes, flushed, once per key (a key in `done` or written before is dropped: a
    retried worker may deliver a row twice); returns the number written. The one writer of a results file."""
    config_hash = sha256_json(comparable(config))
    seen = set(done)
    desc = path.parent.name
    # It counts units (one example under one method and position, or one e2e question under one method), not
    # examples: a rate in examples would overstate the speed by the methods x positions.
    bar = tqdm(total=total, initial=len(seen), desc=desc, unit="unit", disable=not progress, dynamic_ncols=True)
    written = 0
    with path.open("a", encoding="utf-8") as handle:
        for row in rows:
            if row["key"] in seen:
                continue
            seen.add(row["key"])
            handle.write(json.dumps({**row, "config_sha256": config_hash}, ensure_ascii=False) + "\n")
            handle.flush()
            written += 1
            bar.update(1)
    bar.close()
    return written


def per_method(group: list[dict], evaluate: Callable[[str, list[dict]], list[dict]]) -> list[dict]:
    """Rows for a group of units in its order, each method's units evaluated in one call (one generator's batch)."""
    rows: list[dict | None] = [None] * len(group)
    for method in dict.fromkeys(u["method"] for u in group):
        mine = [i for i, u in enumerate(group) if u["method"] == method]
        for i, row in zip(mine, evaluate(method, [group[i] for i in mine]), strict=True):
            rows[i] = row
    return rows


def unit_groups(units: list[dict], size: int) -> list[list[dict]]:
    """Units in groups of at least `size` (or what is left), one method and whole examples each.

    Groups follow the examples: a chunk of consecutive examples holding at least `size` units of every method,
    then one group per method within it. So a run cut at any point has its finished examples done by every
    method (paired reports read them), instead of one method far ahead of the others."""
    methods = list(dict.fromkeys(u.get("method") for u in units))
    examples = list(dict.fromkeys(u["example"] for u in units))
    by_example: dict = {}
    for unit in units:
        by_example.setdefault(unit["example"], []).append(unit)
    groups: list[list[dict]] = []
    chunk: dict = {m: [] for m in methods}
    for i, example in enumerate(examples):
        for unit in by_example[example]:
            chunk[unit.get("method")].append(unit)
        # A method with no unit here (finished before a resume) does not hold the chunk open.
        if i + 1 == len(examples) or all(len(us) >= size for us in chunk.values() if us):
            groups.extend(chunk[m] for m in methods if chunk[m])
            chunk = {m: [] for m in methods}
    return groups


def merge(sources: Iterable[Path], out: Path) -> tuple[int, int]:
    """Join run dirs and/or shard files into out/results.jsonl -> (rows written, units still missing)."""
    configs, rows = [], {}
    for src in map(Path, sources):
        files = [src] if src.is_file() else sorted(src.glob("results*.jsonl"))
        cfg_path = (src.parent if src.is_file() else src) / CONFIG
        if not cfg_path.exists():
            raise RunError(f"{cfg_path} not found: {src} is not a midlens eval run directory.")
        configs.append((src, json.loads(cfg_path.read_text())))
        for f in files:
            for row in read_rows(f):
                old = rows.get(row["key"])
                if old is not None and comparable(old) != comparable(row):
                    raise RunError(f"{f}: unit {row['key']} is also in another source with a different result.")
                rows[row["key"]] = row
    if not configs:
        raise RunError("merge: no sources given.")
    first_src, first = configs[0]
    for src, cfg in configs[1:]:
        if comparable(cfg) != comparable(first):
            raise RunError(f"{src} and {first_src} are different runs (configs differ); merge only shards of one run.")
    merged = sorted(rows.values(), key=lambda r: r["order"])
    out = Path(out)
    make_folder(out)
    if (out / CONFIG).resolve() != (Path(first_src) / CONFIG).resolve():
        write_atomic(out / CONFIG, json.dumps({**first, "shard": "merged"}, indent=2, sort_keys=True) + "\n")
    write_atomic(out / RESULTS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in merged))
    return len(merged), max(0, first.get("units", len(merged)) - len(merged))
