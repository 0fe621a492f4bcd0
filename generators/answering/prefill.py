"""The beginning every pass over a batch of prompts shares: which prompts may share a batch, and its prefill.

Answering (generators.answering.decoding) and the citation scoring passes (generators.answering.citation_scoring) all
start alike: the method installed on the shared model, the prompts left-padded on one KV cache
(generators.answering.batch), the prefill read by the passage probe, then, inside the method's answering hook, the last
prompt column read again under whatever the hook set. `prepared` is that beginning, written once; each pass goes on from
the first answer token's logits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from midlens.generators.answering.batch import BatchRun
from midlens.generators.attention.probe import PassageProbe
from midlens.generators.attention.rope_regimes import regime_groups, rope_switches, row_reach
from midlens.generators.methods.install import MethodParts, MethodRun
from midlens.generators.methods.instances import Mixture, expand
from midlens.generators.models.loading import LoadedModel
from midlens.generators.models.prompt import CONTENT_FREE_QUESTION, StackedPrompt, render_many


class MethodRunner(Protocol):
    """What a pass reads of the generator that runs it (generators.answering.generator.Generator)."""

    loaded: LoadedModel
    parts: MethodParts

    def probe_layers(self) -> list[int]: ...

    def running(self, probe: PassageProbe | None = None) -> AbstractContextManager[MethodRun]: ...


@dataclass
class Prepared:
    """A prefilled batch inside its method's answering hook: its run, how its rows mix into prompts, the first
    answer token's logits per prompt, and when the hook was entered (what decoding's time counts from)."""

    run: BatchRun
    mixture: Mixture
    logits: torch.Tensor
    started: float


@contextmanager
def prepared(
    runner: MethodRunner,
    prompts: list[StackedPrompt],
    cite: bool = False,
    calibrate: bool = False,
    timings: dict[str, float] | None = None,
) -> Iterator[Prepared]:
    """`prompts` prefilled under `runner`'s method, inside its answering hook for the body of the `with`; once the
    hook is left, the content-free pass when `calibrate` (evidence calibrated against "N/A"). `cite`: the answer's
    own queries also record their mass over the passages' sentences (generators.answering.batch.BatchRun).
    `timings` start the run's (shared by its Answers)."""
    mixture = Mixture(runner.parts.instances, len(prompts))  # one row per prompt unless the method runs several
    hook = runner.parts.answering
    with runner.running() as method_run:
        run = BatchRun(runner.loaded, expand(prompts, mixture.count), method_run, runner.probe_layers(), cite=cite)
        run.timings.update(timings or {})
        with method_run.probe(run.probe):
            t0 = time.perf_counter()
            logits = mixture.logits(run.prefill())
            run.timings["prefill_s"] = time.perf_counter() - t0
            with hook(run.view()) if hook is not None else nullcontext():
                started = time.perf_counter()
                if hook is not None:  # the last prompt token's query gives the first answer token: read it
                    logits = mixture.logits(run.reread_last())  # again, under the method
                yield Prepared(run, mixture, logits, started)
            if calibrate:
                run.content_free_maps()


def rope_groups(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[StackedPrompt],
    max_new_tokens: int,
    reference_ids: list[list[int] | None],
) -> list[list[int]]:
    """The prompts in batches that rotate as each prompt alone would (one batch unless the model's RoPE tables
    switch with the length, LongRoPE's or dynamic NTK's: `generators.attention.rope_regimes`)."""
    switches = rope_switches(model) if len(prompts) > 1 else []
    if not switches:
        return [list(range(len(prompts)))]
    # The content-free pass may run whether or not calibration is asked for (a method's hook reads it).
    with_passages = [p for p in prompts if p.passages]
    requests = [(p.passages, CONTENT_FREE_QUESTION, p.style) for p in with_passages]
    nulls = dict(zip(map(id, with_passages), render_many(tokenizer, requests, sentences=False), strict=True))
    reaches = [
        row_reach(
            p.num_tokens,
            max_new_tokens,
            0 if ref is None else len(ref),
            nulls[id(p)].num_tokens if id(p) in nulls else None,
        )
        for p, ref in zip(prompts, reference_ids, strict=True)
    ]
    return regime_groups(reaches, switches)
