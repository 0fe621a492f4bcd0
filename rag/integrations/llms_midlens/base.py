"""`llama_index.llms.midlens.base`: where a LlamaIndex LLM integration keeps its class (llama-index-llms-* layout).
Defined in midlens.rag.llamaindex.llm, whose module imports no torch: the model's code loads when the LLM is made."""

from midlens.rag.llamaindex.llm import MidlensLLM, RemoteMidlensLLM

__all__ = ["MidlensLLM", "RemoteMidlensLLM"]
