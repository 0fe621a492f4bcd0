"""Batch sizes as every shell takes them: `N` or `auto` (resolved by generators.answering.scheduling), read without
torch."""

from __future__ import annotations

from typing import Literal

from midlens.core.errors import InvalidArgumentError

AUTO_START = 64  # where `auto` starts on a GPU, halving on out-of-memory
BatchSize = int | Literal["auto"]


def parse_batch_size(value: str | int) -> BatchSize:
    """`N` (a positive integer) or `auto`."""
    if value == "auto":
        return "auto"
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise InvalidArgumentError(f"batch size {value!r}: expected a positive integer or 'auto'.")
    return size


def units_per_group(size: BatchSize, device: str) -> int:
    """How many prompts a batch of `size` holds on `device` ("cuda" or "cpu"): `auto` is AUTO_START on a GPU and 1
    on the CPU, where batches are not faster (docs/results/batch/)."""
    if size == "auto":
        return AUTO_START if device == "cuda" else 1
    return size
