"""midlens: RAG that finds what long prompts lose in the middle. `midlens.cli` is the command line.

The public names below import from the top (`midlens.Pipeline`, `midlens.Generator`, ...) but load on first use:
`import midlens` alone loads no torch, so `midlens --help` stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

# name -> the module that defines it
_LAZY = {
    "Pipeline": "midlens.rag.pipeline",
    "AnswerOptions": "midlens.rag.options",
    "Generator": "midlens.generators.generator",
    "Answer": "midlens.generators.answer",
    "EvidenceConfig": "midlens.generators.evidence",
    "DenseRetriever": "midlens.retrievers.dense",
    "load_model": "midlens.generators.loading",
}
__all__ = [
    "Answer",
    "AnswerOptions",
    "DenseRetriever",
    "EvidenceConfig",
    "Generator",
    "Pipeline",
    "__version__",
    "load_model",
]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from midlens.generators.answer import Answer
    from midlens.generators.evidence import EvidenceConfig
    from midlens.generators.generator import Generator
    from midlens.generators.loading import load_model
    from midlens.rag.options import AnswerOptions
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.dense import DenseRetriever


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'midlens' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
