"""Lexical retrieval: BM25 (bm25s) over the same passages the dense index holds.

Names, dates and rare words, which a small sentence embedder blurs, are what multi-hop questions hinge
on; BM25 matches them exactly. The index lives in memory and is rebuilt from the passages on load:
bm25s indexes about 100k short passages a second, far less than embedding them took.
"""

from __future__ import annotations

import numpy as np

from midlens.core.passage import Passage


def _text(passage: Passage) -> str:
    return f"{passage.title}: {passage.text}" if passage.title else passage.text


def _query_tokens(query: str) -> list[str]:
    import bm25s

    return bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]


class BM25Index:
    def __init__(self, passages: list[Passage]):
        import bm25s

        self.passages = passages
        self._bm25 = bm25s.BM25()
        tokens = bm25s.tokenize([_text(p) for p in passages], stopwords="en", show_progress=False)
        self._bm25.index(tokens, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage (0 where no query word occurs; all 0 for a query of stop words only)."""
        tokens = _query_tokens(query)
        if not tokens:
            return np.zeros(len(self.passages), dtype=np.float32)
        return np.asarray(self._bm25.get_scores(tokens), dtype=np.float32)


def bm25_scores(question: str, passages: list[Passage]) -> list[float]:
    """BM25 of a handful of passages for one question (the reranker's lexical baseline)."""
    return [float(s) for s in BM25Index(passages).scores(question)]
