"""`midlens eval` (being built)."""

from __future__ import annotations

import argparse


def add_eval_parser(sub) -> None:
    ev = sub.add_parser("eval", help="offline MDQA evaluation (not built yet)")
    ev.set_defaults(func=_not_built)


def _not_built(args: argparse.Namespace) -> int:
    raise SystemExit("midlens eval is not built yet.")
