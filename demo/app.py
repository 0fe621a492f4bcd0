"""Gradio demo (being built): `midlens demo`."""

from __future__ import annotations

import argparse


def add_demo_parser(sub) -> None:
    demo = sub.add_parser("demo", help="Gradio demo on 127.0.0.1 (not built yet)")
    demo.set_defaults(func=_not_built)


def _not_built(args: argparse.Namespace) -> int:
    raise SystemExit("midlens demo is not built yet.")
