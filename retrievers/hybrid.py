"""Hybrid retrieval: the dense ranking and the BM25 ranking fused by reciprocal rank (Cormack et al., 2009).

RRF score of a passage = sum over the two rankings of 1 / (rrf_k + rank), rank from 1; a passage outside a
ranking's first `depth` adds nothing from it. Ranks, not scores, are fused, so cosine similarities and
BM25 scores need no common scale. rrf_k = 60 is the paper's constant, not tuned here.

Measured with this module (title matches; `python -m midlens.eval.build_default_corpus --split train ...` writes the
train-split copy), share of gold paragraphs retrieved / questions with both gold paragraphs retrieved:
                        train-split copy (60 q, 651 passages)    embedded e2e set (40 q, 400 passages)
    top-5    dense      71.7 / 48.3                              75.0 / 52.5
             hybrid     74.2 / 48.3                              80.0 / 62.5
    top-10   dense      80.8 / 61.7                              88.8 / 80.0
             hybrid     88.3 / 76.7                              91.2 / 85.0
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from midlens.core.defaults import DEFAULT_TOP_K
from midlens.core.passage import Passage
from midlens.retrievers.dense import DenseRetriever, checked_top_k
from midlens.retrievers.lexical import BM25Index

RRF_K = 60
FUSION_DEPTH = 100  # ranks read from each list: far past any top-k a prompt holds


class HybridRetriever:
    """Dense (faiss) + BM25, fused by reciprocal rank. Same interface as DenseRetriever: `search`, `passages`,
    `meta`, `len()`; `score` of a returned passage is its RRF score."""

    def __init__(self, dense: DenseRetriever, rrf_k: int = RRF_K, depth: int = FUSION_DEPTH):
        self.dense = dense
        self.lexical = BM25Index(dense.passages)
        self.rrf_k = rrf_k
        self.depth = depth
        self.meta = {**dense.meta, "retrieval": "hybrid", "rrf_k": rrf_k}

    @property
    def passages(self) -> list[Passage]:
        return self.dense.passages

    def __len__(self) -> int:
        return len(self.dense)

    def search(self, query: str, top_k: int = DEFAULT_TOP_K) -> list[Passage]:
        """Top-k passages by fused rank, best first."""
        k = checked_top_k(query, top_k, len(self))
        return [replace(self.passages[i], score=s) for i, s in self.ranked(query, k)]

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(passage index, RRF score) of the k best passages by fused rank, best first."""
        depth = min(len(self), max(self.depth, k))
        fused = np.zeros(len(self), dtype=np.float64)
        dense = [i for i, _ in self.dense.ranked(query, depth)]
        bm25 = self.lexical.scores(query)
        # Only passages sharing a word with the query are ranked by BM25: ties at 0 would hand corpus order a bonus.
        lexical = [i for i in np.argsort(-bm25, kind="stable")[:depth] if bm25[i] > 0]
        for ranking in (dense, lexical):
            for rank, i in enumerate(ranking, start=1):
                fused[i] += 1.0 / (self.rrf_k + rank)
        return [(int(i), float(fused[i])) for i in np.argsort(-fused, kind="stable")[:k]]
