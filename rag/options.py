"""Command-line options every shell shares (ask, demo, eval, bench): model, method spec, device, dtype, evidence.

Argparse only at import time (so `--help` stays fast); the parsed strings are validated by the layers below
(`generators.registry.method_config`, `core.device`) before any model loads.
"""

from __future__ import annotations

import argparse

from core.errors import MidlensError

METHOD_HELP = (
    "method spec: NAME or NAME(option=value, ...), e.g. 'ms-poe(ratio_min=1.0, ratio_max=1.3)'; "
    "`midlens methods` lists the methods and their options"
)


def add_model_args(parser: argparse.ArgumentParser, method: bool = True) -> None:
    from generators.models import DEFAULT_MODEL  # no torch: the registry module imports it lazily

    parser.add_argument("--model", default=DEFAULT_MODEL, help="registry name or local Hugging Face folder")
    if method:
        parser.add_argument("--method", default="baseline", help=METHOD_HELP)
    add_device_args(parser)
    parser.add_argument(
        "--evidence-layers", default="upper", help="layers evidence averages: all | upper | lower | e.g. 20,21,22"
    )
    parser.add_argument("--evidence-query", default="question", choices=["last", "question"])


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")
    parser.add_argument(
        "--dtype", default="auto", help="auto | float32 | bfloat16 | float16 (auto: bfloat16 on CUDA, else float32)"
    )


def check_device(args: argparse.Namespace) -> None:
    """Resolve --device/--dtype now, so a missing GPU is reported before anything loads."""
    from core.device import resolve_device, resolve_dtype

    resolve_dtype(args.dtype, resolve_device(args.device))


def method_spec(args: argparse.Namespace):
    """--method as a validated MethodConfig (unknown names and options fail here, before any model loads)."""
    from generators.registry import method_config

    return method_config(args.method)


def evidence_config(args: argparse.Namespace):
    from generators.evidence import EvidenceConfig

    layers = args.evidence_layers
    if layers not in ("all", "upper", "lower"):
        try:
            layers = [int(x) for x in layers.split(",")]
        except ValueError:
            raise MidlensError(f"--evidence-layers {layers!r}: use all, upper, lower or e.g. 20,21,22.") from None
    return EvidenceConfig(query=args.evidence_query, layers=layers)
