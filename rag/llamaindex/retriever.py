"""MidlensRetriever: a LlamaIndex BaseRetriever over midlens' own retrievers (dense, hybrid, +links)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from midlens.core.defaults import DEFAULT_RETRIEVAL, DEFAULT_TOP_K
from midlens.core.validation import check_top_k


class MidlensRetriever(BaseRetriever):
    """The repo's retriever (dense: faiss + packaged MiniLM; hybrid: + BM25; +links: titles the top 2 name) as a
    LlamaIndex retriever."""

    def __init__(self, retriever: Any, similarity_top_k: int = DEFAULT_TOP_K, **kwargs: Any) -> None:
        self._retriever = retriever
        self.similarity_top_k = check_top_k(similarity_top_k, "similarity_top_k")
        super().__init__(**kwargs)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | Path,
        index_dir: str | Path | None = None,
        similarity_top_k: int = DEFAULT_TOP_K,
        retrieval: str = DEFAULT_RETRIEVAL,
        **kwargs: Any,
    ) -> MidlensRetriever:
        """Build (or reuse) the index of a folder / .jsonl corpus, as `midlens ask --corpus` does."""
        from midlens.retrievers.build import build_retriever

        return cls(build_retriever(corpus, retrieval, index_dir=index_dir), similarity_top_k, **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(
                node=TextNode(
                    id_=p.id or None,
                    text=p.text,
                    metadata={"title": p.title, **p.metadata},
                    excluded_embed_metadata_keys=list(p.metadata),
                    excluded_llm_metadata_keys=list(p.metadata),
                ),
                score=p.score,
            )
            for p in self._retriever.search(query_bundle.query_str, self.similarity_top_k)
        ]
