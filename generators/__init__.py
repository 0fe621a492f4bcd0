"""Generators: a RoPE model run with one method (baseline, Ms-PoE; MoICE and MuDAF next)."""

from generators.generator import GenerationStream, Generator
from generators.methods import BUILT, METHODS, MethodConfig, method_config

__all__ = ["BUILT", "METHODS", "GenerationStream", "Generator", "MethodConfig", "method_config"]
