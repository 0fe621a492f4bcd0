"""`midlens bench`: benchmarks (commands, not tests) of evidence, the methods and batched generation."""

from __future__ import annotations


def add_parser(sub) -> None:
    from midlens.eval.bench import add_bench_parser

    add_bench_parser(sub)
