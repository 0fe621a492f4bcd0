"""midlens: RAG that finds what long prompts lose in the middle. `midlens.cli` is the command line."""

__version__ = "0.2.0"
