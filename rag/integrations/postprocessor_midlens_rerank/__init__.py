"""`llama_index.postprocessor.midlens_rerank`: the attention reranker under LlamaIndex's conventional path (the class
at `base.py`, as in every llama-index-postprocessor-* package)."""

from llama_index.postprocessor.midlens_rerank.base import AttentionReranker

__all__ = ["AttentionReranker"]
