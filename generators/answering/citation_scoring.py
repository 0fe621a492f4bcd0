"""Citation scoring: how an answer's citations are read and checked, with passes that never decode.

- `cite_answer`: an answer's per-sentence citations from its rows' segment mass (generators.answering.citations.cite),
the
  one computation behind a finished Answer's citations and those streamed as each sentence ends (`SentenceCiter`).
- `verify_citations`: each citation checked by ablation, the answer's tokens teacher-forced after its prompt with
  a cited passage removed (`forced_logprobs`, one teacher-forced pass per batch).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from midlens.core.errors import InvalidArgumentError
from midlens.core.sentences import sentence_spans
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.batch import BatchRun
from midlens.generators.answering.citations import Citation, cite
from midlens.generators.answering.passage_evidence import CitingRunner, prompt_evidence
from midlens.generators.answering.prefill import prepared, rope_groups
from midlens.generators.attention.evidence import PassageEvidence
from midlens.generators.methods.instances import Mixture
from midlens.generators.models.prompt import StackedPrompt, render


def cite_answer(
    runner: CitingRunner,
    prompt: StackedPrompt,
    decoded: str,
    ids: list[int],
    segment_mass: torch.Tensor | None,
    evidence: list[PassageEvidence],
    ends: list[int] | None,
) -> list[Citation]:
    """The citations of an answer (`decoded`, possibly still growing) from its rows' segment mass: the one
    computation behind a finished Answer's citations and those streamed as each sentence ends."""
    return cite(
        prompt,
        decoded.strip(),
        decoded,
        ids,
        runner.tokenizer,
        segment_mass,
        runner.evidence_config,
        runner.citations,
        evidence,
        ends,
    )


def segments_per_row(
    run: BatchRun, fed: list[int], count: int, segments: torch.Tensor | None
) -> list[torch.Tensor | None]:
    """Each batch row's fed answer tokens' mass over its prompt's segments [layers, H, fed, segments] (None where
    nothing was fed); batch row r is an instance of prompt r // `count`, which fed `fed[r // count]` tokens back."""
    per_row: list[torch.Tensor | None] = []
    for r, prompt in enumerate(run.prompts):
        n = fed[r // count]
        per_row.append(None if segments is None or n == 0 else segments[:, r, :, :n, : len(prompt.segments())])
    return per_row


class SentenceCiter:
    """Citations of a streamed answer's sentences as they end: a sentence has ended once the splitter sees the
    next one begin. Each is computed as the final Answer's will be (`cite_answer` on the answer so far, with the
    rows fed so far and the passage evidence), so the streamed Citation equals the final one."""

    def __init__(
        self,
        runner: CitingRunner,
        run: BatchRun,
        mixture: Mixture,
        prompts: list[StackedPrompt],
        cited_evidence: list[list[PassageEvidence]] | None = None,
    ):
        self.runner, self.run, self.mixture, self.prompts = runner, run, mixture, prompts
        self.emitted = [0] * len(prompts)
        self._evidence: dict[int, list[PassageEvidence]] = dict(enumerate(cited_evidence or []))

    def ended(
        self, b: int, text: str, ids: list[int], ends: list[int], fed: list[int]
    ) -> Iterator[tuple[int, Citation]]:
        """Row `b`'s sentences that have ended since the last call (its answer so far: `text`, token `ids`, their
        character `ends`; `fed`: each prompt's tokens fed back so far)."""
        ended = len(sentence_spans(text.strip())) - 1  # the last sentence may still grow
        if ended <= self.emitted[b] or not self.prompts[b].passages:
            return
        segments = self.run.probe.answer_spans_so_far()
        mass = self.mixture.mass(segments_per_row(self.run, fed, self.mixture.count, segments), b)
        citations = cite_answer(self.runner, self.prompts[b], text, ids, mass, self._evidence_of(b), ends)
        for citation in citations[self.emitted[b] : ended]:
            yield b, citation
        self.emitted[b] = max(self.emitted[b], min(ended, len(citations)))

    def _evidence_of(self, b: int) -> list[PassageEvidence]:
        if b not in self._evidence:
            maps = self.mixture.maps(self.run.maps, b)
            self._evidence[b] = prompt_evidence(self.runner, self.prompts[b], maps)
        return self._evidence[b]


def forced_logprobs(runner: CitingRunner, prompts: list[StackedPrompt], answers: list[list[int]]) -> list[list[float]]:
    """log p(token | prompt, earlier tokens) of each answer's tokens after its prompt: one teacher-forced chunk per
    batch (one batch per RoPE regime), nothing decoded, nothing calibrated."""
    out: list[list[float]] = [[] for _ in prompts]
    for group in rope_groups(runner.model, runner.tokenizer, prompts, 0, list(answers)):
        batch, references = [prompts[i] for i in group], [answers[i] for i in group]
        with prepared(runner, batch, cite=runner.citations is not None) as ready:
            mix = None if ready.mixture.instances is None else ready.mixture.reference
            logprobs = ready.run.reference_logprobs(ready.logits, references, mix)
        for b, i in enumerate(group):
            out[i] = logprobs[b]
    return out


def verify_citations(
    runner: CitingRunner, prompts: list[StackedPrompt], answers: list[Answer], batch_size: int
) -> list[int]:
    """Check every citation against the answer it came with (`Generator.verify`): the answer's tokens scored
    teacher-forced with each cited passage removed, in batches; a source is verified when its answer sentence
    loses at least `CitationConfig.margin` nats (`logprob_drop` holds the loss). Sets the sources' drops in place;
    returns the indices of the answers whose citations were checked."""
    jobs: list[tuple[int, int | None]] = []  # (answer, removed passage position or None for the full prompt)
    scored: list[StackedPrompt] = []
    for i, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        cited = sorted({s.position for c in answer.citations for s in c.sources})
        if not cited:
            continue
        if prompt.num_tokens + len(answer.answer_ids) > runner.context_window:
            raise InvalidArgumentError(
                f"cannot verify the citations of answer {i + 1}: its prompt ({prompt.num_tokens} tokens) and "
                f"answer ({len(answer.answer_ids)} tokens) no longer fit the {runner.context_window}-token window; "
                "verify with the prompt the answer was generated from, or with fewer passages."
            )
        for position in [None, *cited]:
            kept = [p for j, p in enumerate(prompt.passages, start=1) if j != position]
            ablated = None if position is None else render(runner.tokenizer, kept, prompt.question, prompt.style)
            scored.append(prompt if ablated is None else ablated)
            jobs.append((i, position))
    logprobs: list[list[float]] = []
    for start in range(0, len(scored), batch_size):
        refs = [list(answers[i].answer_ids) for i, _ in jobs[start : start + batch_size]]
        logprobs += forced_logprobs(runner, scored[start : start + batch_size], refs)
    full: dict[int, list[float]] = {}
    for (i, position), lp in zip(jobs, logprobs, strict=True):
        if position is None:
            full[i] = lp
            continue
        for citation in answers[i].citations:
            a, b = citation.tokens
            drop = sum(full[i][a:b]) - sum(lp[a:b])
            for source in citation.sources:
                if source.position == position:
                    source.logprob_drop, source.verified = drop, drop >= runner.citations.margin
    return list(full)
