"""Generators: a RoPE model run with one method through one attention module, reading per-passage evidence.

Public API: `Generator` (`generate`, `generate_batch`, `stream`, `score`), `generate_all` (many prompts in batches
of a fixed size or `auto`), `CitationConfig` / `MeasuredCitations` (how answers cite), `load_model` (once per
process; `release_model` forgets one), the method registry (`method_config`, `register`, `Method`, `available`),
`Restack` / `Restacker` (passages re-stacked by a method's evidence before any method answers) and
`method_context` for code that drives the model itself (training loops, benchmarks).
"""

from midlens.generators.answering.citations import CitationConfig, MeasuredCitations
from midlens.generators.answering.generator import GenerationStream, Generator
from midlens.generators.answering.restack import Restack, Restacker
from midlens.generators.answering.scheduling import generate_all
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.registry import Method, MethodConfig, available, build_parts, method_config, register
from midlens.generators.models.loading import LoadedModel, load_model, release_model
from midlens.generators.models.packaged_models import DEFAULT_MODEL

__all__ = [
    "DEFAULT_MODEL",
    "CitationConfig",
    "GenerationStream",
    "Generator",
    "LoadedModel",
    "MeasuredCitations",
    "Method",
    "MethodConfig",
    "MethodParts",
    "Restack",
    "Restacker",
    "available",
    "build_parts",
    "generate_all",
    "load_model",
    "method_config",
    "method_context",
    "register",
    "release_model",
]
