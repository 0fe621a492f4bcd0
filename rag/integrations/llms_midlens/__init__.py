"""`llama_index.llms.midlens`: midlens' LLM under LlamaIndex's conventional path (the class at `base.py`, as in every
llama-index-llms-* package). Importing it loads llama_index.core and no torch."""

from llama_index.llms.midlens.base import MidlensLLM, RemoteMidlensLLM

__all__ = ["MidlensLLM", "RemoteMidlensLLM"]
