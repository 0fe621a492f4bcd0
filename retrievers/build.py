"""The retriever a pipeline asks for by name: the dense index, BM25 fused in ("hybrid"), links followed ("+links")."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from midlens.core.defaults import DEFAULT_RETRIEVAL, RETRIEVALS
from midlens.core.errors import InvalidArgumentError
from midlens.retrievers.base import Retriever
from midlens.retrievers.dense import DenseRetriever, IndexType
from midlens.retrievers.hybrid import HybridRetriever
from midlens.retrievers.links import LinkedRetriever

Retrieval = Literal["dense", "hybrid", "dense+links", "hybrid+links"]


def check_retrieval(retrieval: str) -> str:
    if retrieval not in RETRIEVALS:
        raise InvalidArgumentError(f"retrieval={retrieval!r}: expected one of {', '.join(RETRIEVALS)}.")
    return retrieval


def build_retriever(
    corpus: str | Path,
    retrieval: Retrieval = DEFAULT_RETRIEVAL,
    index_dir: str | Path | None = None,
    index_type: IndexType = "flat",
) -> Retriever:
    """The dense index (built or reused), with BM25 fused in for "hybrid", links followed for "...+links"."""
    check_retrieval(retrieval)
    dense = DenseRetriever.build(corpus, index_dir=index_dir, index_type=index_type)
    base = HybridRetriever(dense) if retrieval.startswith("hybrid") else dense
    return LinkedRetriever(base) if retrieval.endswith("+links") else base
