"""The baseline: the model's own RoPE, nothing changed (the identity case every method extends)."""

from __future__ import annotations

from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method, Options


def build(loaded, options: Options) -> MethodParts:
    return MethodParts(baseline_schemes(loaded.model))


METHOD = Method("baseline", "the model's own RoPE, nothing changed", build=build)
