"""What the layers above need from a retriever: the dense one, the hybrid one, or a user's own."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from midlens.core.defaults import DEFAULT_TOP_K
from midlens.core.passage import Passage


@runtime_checkable
class Retriever(Protocol):
    """`search` returns the `top_k` best passages, best first, each with its `score`; `meta` describes the index
    (its `fingerprint` names the corpus and embedder, for caches and run configs)."""

    meta: dict

    def search(self, query: str, top_k: int = DEFAULT_TOP_K) -> list[Passage]: ...

    def __len__(self) -> int: ...


@runtime_checkable
class RankingRetriever(Retriever, Protocol):
    """A retriever that also exposes its ranking as passage indices (dense, hybrid), which retrievers built on top
    of another (retrievers.links) read beyond the top-k."""

    passages: list[Passage]

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]: ...
