"""Many prompts through one generator in batches: a fixed size, or `auto`, the largest batch that fits.

`auto` on a GPU starts at `AUTO_START` and halves on out-of-memory; prompts go longest first, so the batch that
needs the most memory runs first and a failure comes early, not after an hour (lm-evaluation-harness's
`--batch_size auto` works the same way). On the CPU, `auto` is 1: measured on 2 cores, batches give no more
examples per second there (docs/results/batch/), so batching is a correctness feature on the CPU and a
throughput feature on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from midlens.core.batch_size import BatchSize, parse_batch_size, units_per_group
from midlens.generators.answering.answer import Answer
from midlens.generators.models.prompt import StackedPrompt


def _out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def generate_all(
    generator,
    prompts: list[StackedPrompt],
    batch_size: BatchSize = 1,
    references: list[str | None] | None = None,
    on_batch: Callable[[int], None] | None = None,
    **options,
) -> list[Answer]:
    """One Answer per prompt, in the prompts' order, generated `batch_size` at a time (longest first).

    `options` are `Generator.generate_batch`'s; `on_batch(n)` is told after each batch how many it answered."""
    size = units_per_group(parse_batch_size(batch_size), generator.device.type)
    references = references or [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda i: -prompts[i].num_tokens)
    answers: list[Answer | None] = [None] * len(prompts)
    start = 0
    while start < len(order):
        chunk = order[start : start + size]
        try:
            done = generator.generate_batch(
                [prompts[i] for i in chunk], references=[references[i] for i in chunk], **options
            )
        except RuntimeError as err:
            if not _out_of_memory(err) or size == 1 or batch_size != "auto":
                raise
            if generator.device.type == "cuda":
                torch.cuda.empty_cache()
            size //= 2  # retry the same prompts, fewer at a time
            continue
        for i, answer in zip(chunk, done, strict=True):
            answers[i] = answer
        start += len(chunk)
        if on_batch is not None:
            on_batch(len(chunk))
    return answers
