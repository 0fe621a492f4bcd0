"""Each passage's evidence, assembled once: a prompt's evidence maps (read by the probe from the very scores the
attention applied, generators.attention.probe) made into one PassageEvidence per passage under the runner's
evidence settings (`prompt_evidence`, for every answering pass and checked answer), and the evidence another
method reads of the same prompts (`scored_evidence`, for `CitationConfig.evidence_from` and restacking): one
prefill per prompt, batched, and the content-free pass when calibrated."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from midlens.generators.answering.citations import CitationConfig
from midlens.generators.answering.prefill import MethodRunner, prepared, rope_groups
from midlens.generators.attention.evidence import EvidenceConfig, PassageEvidence, passage_evidence
from midlens.generators.models.prompt import StackedPrompt


class CitingRunner(MethodRunner, Protocol):
    """What citation scoring reads of the generator that runs it (generators.answering.generator.Generator)."""

    citations: CitationConfig | None
    evidence_config: EvidenceConfig
    windows: list[int | None]

    @property
    def tokenizer(self) -> Any: ...

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def context_window(self) -> int: ...


def prompt_evidence(runner: CitingRunner, prompt: StackedPrompt, maps) -> list[PassageEvidence]:
    """One prompt's passage evidence from its maps, under `runner`'s evidence settings."""
    return passage_evidence(
        prompt.passages,
        maps,
        runner.evidence_config,
        prompt.passage_spans,
        runner.windows,
        prompt.num_tokens,
        prompt.question_span,
    )


def scored_evidence(scorer: CitingRunner, prompts: list[StackedPrompt], calibrate: bool) -> list[list[PassageEvidence]]:
    """Each prompt's passage evidence as `scorer`'s method reads it: the prompts prefilled in batches (one per RoPE
    regime), calibrated against the content-free question when `calibrate`. What `scorer.score_batch` returns as
    `Answer.passages`, without assembling Answers or entering a decode loop."""
    evidence: list[list[PassageEvidence]] = [[] for _ in prompts]
    for group in rope_groups(scorer.model, scorer.tokenizer, prompts, 0, [None] * len(prompts)):
        batch = [prompts[i] for i in group]
        with prepared(scorer, batch, cite=scorer.citations is not None, calibrate=calibrate) as ready:
            pass
        for b, i in enumerate(group):
            evidence[i] = prompt_evidence(scorer, batch[b], ready.mixture.maps(ready.run.maps, b))
    return evidence
