"""midlens: RAG that finds what long prompts lose in the middle. `midlens.cli` is the command line.

The public names below import from the top (`midlens.Pipeline`, `midlens.Generator`, ...) but load on first use:
`import midlens` alone loads no torch, so `midlens --help` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from midlens.core.lazy import lazy_attributes

__version__ = "0.2.0"

# name -> the module that defines it
_LAZY = {
    "Pipeline": "midlens.rag.pipeline",
    "AnswerOptions": "midlens.rag.options",
    "Generator": "midlens.generators.answering.generator",
    "Answer": "midlens.generators.answering.answer",
    "EvidenceConfig": "midlens.generators.attention.evidence",
    "DenseRetriever": "midlens.retrievers.dense",
    "load_model": "midlens.generators.models.loading",
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
    from midlens.generators.answering.answer import Answer
    from midlens.generators.answering.generator import Generator
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.loading import load_model
    from midlens.rag.options import AnswerOptions
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.dense import DenseRetriever


__getattr__, __dir__ = lazy_attributes("midlens", _LAZY, globals())
