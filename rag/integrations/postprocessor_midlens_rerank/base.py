"""`llama_index.postprocessor.midlens_rerank.base`: where a LlamaIndex postprocessor integration keeps its class
(llama-index-postprocessor-* layout). Defined in midlens.rag.llamaindex.reranker."""

from midlens.rag.llamaindex.reranker import AttentionReranker

__all__ = ["AttentionReranker"]
