"""`llama_index.llms.midlens`: midlens' LLM under LlamaIndex's conventional path (defined in rag.llamaindex)."""

from midlens.rag.llamaindex import MidlensLLM

__all__ = ["MidlensLLM"]
