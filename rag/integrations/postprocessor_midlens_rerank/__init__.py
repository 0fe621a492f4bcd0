"""`llama_index.postprocessor.midlens_rerank`: the attention reranker under LlamaIndex's conventional path
(defined in rag.llamaindex)."""

from midlens.rag.llamaindex import AttentionReranker

__all__ = ["AttentionReranker"]
