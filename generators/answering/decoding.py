"""The decode loop: a batch of prompts answered token by token on one KV cache, each row as it would be alone.

`answer_steps` is the loop every answering call of `Generator` runs (generate, generate_batch, stream, score,
attribute): the citation scorer's evidence (`evidence_from`, generators.answering.citation_scoring), the prefill
(generators.answering.prefill), the method's answering hook, decoding, the answer's attention and the references'
log-probabilities, the content-free pass, then one Answer per prompt. It yields (row, text delta) and, with
citations streamed, (row, Citation) as it goes, and returns the Answers. Nothing it calls enters it again: the
passes that score citations prefill batches of their own and never decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from collections.abc import Generator as Generator_
from dataclasses import dataclass, field
from typing import Protocol

import torch

from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS
from midlens.core.errors import InvalidArgumentError, Remedy
from midlens.core.validation import check_max_new_tokens
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.batch import BatchRun
from midlens.generators.answering.citation_scoring import SentenceCiter, cite_answer, segments_per_row
from midlens.generators.answering.citations import Citation, token_end, token_ends
from midlens.generators.answering.detokenize import IncrementalText
from midlens.generators.answering.passage_evidence import CitingRunner, prompt_evidence, scored_evidence
from midlens.generators.answering.prefill import prepared, rope_groups
from midlens.generators.answering.support import Support
from midlens.generators.attention.evidence import PassageEvidence
from midlens.generators.methods.instances import Mixture
from midlens.generators.methods.registry import MethodConfig
from midlens.generators.models.prompt import StackedPrompt


@dataclass(frozen=True)
class DecodeOptions:
    """What one generation call decodes with (`Generator.generate`'s keywords, as one value for the loop)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int | None = 0
    calibrate: bool = True  # also the content-free pass (calibrated evidence)
    stop_at_line_end: bool = False
    ignore_eos: bool = False
    # The references are the answers: their tokens are teacher-forced in one chunk whose attention is read and
    # cited as a generated answer's would be (`Generator.attribute`); nothing is decoded.
    forced: bool = False


# A given answer read as if this model had written it: calibrated like a generated answer, whose citations blend
# in the calibrated evidence.
ATTRIBUTED = DecodeOptions(max_new_tokens=0, seed=None, calibrate=True, forced=True)


class Answerer(CitingRunner, Protocol):
    """What the loop reads of the generator that answers (generators.answering.generator.Generator)."""

    method: MethodConfig
    eos_ids: set[int]
    evidence_scorer: CitingRunner | None

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_id(self) -> int: ...

    def support_of(self, answer: Answer, verified: bool = False) -> Support | None: ...


Steps = Generator_[tuple[int, str | Citation], None, list[Answer]]


def answer_steps(
    gen: Answerer,
    prompts: list[StackedPrompt],
    decode: DecodeOptions,
    references: list[str | list[int] | None] | None = None,
    cancelled: Callable[[int], bool] | None = None,
    cite_as_you_go: bool = False,
) -> Steps:
    """The generation loop, for a batch: yields (row, text delta); returns one Answer per prompt.

    Each row is answered as it would be alone: its own positions and stopping (EOS, line end, max tokens),
    its own sampling stream (seeded with `decode.seed`, as a lone prompt would be), its evidence and citations
    read from its own scoring rows. With `cite_as_you_go` (and citations on) it also yields (row, Citation) for
    each answer sentence once the next one has begun: the calibration pass then runs before decoding (its
    scores are what a citation blends in), and each Citation equals the one in the final Answer."""
    check(gen, prompts, decode)
    references = references or [None] * len(prompts)
    if len(references) != len(prompts):
        raise ValueError(f"{len(references)} references for {len(prompts)} prompts: give one (or None) each.")
    reference_ids = [None if r is None else _reference_ids(gen, r) for r in references]  # refused before decoding
    groups = rope_groups(gen.model, gen.tokenizer, prompts, decode.max_new_tokens, reference_ids)
    if len(groups) > 1:  # rows a length-switching RoPE would rotate otherwise than alone: batches of their own
        return (yield from _each_group(gen, groups, prompts, decode, reference_ids, cancelled, cite_as_you_go))
    return (yield from _batch_steps(gen, prompts, decode, reference_ids, cancelled, cite_as_you_go))


def _batch_steps(
    gen: Answerer,
    prompts: list[StackedPrompt],
    decode: DecodeOptions,
    reference_ids: list[list[int] | None],
    cancelled: Callable[[int], bool] | None,
    cite_as_you_go: bool,
) -> Steps:
    """`answer_steps` on prompts that share one RoPE regime: one batch, one prefill, one decode loop."""
    sampled = decode.temperature > 0 and decode.seed is not None
    rows = Rows.start(len(prompts), decode.max_new_tokens, sampled, decode.seed, gen.device, cancelled)
    rows.decoders = [IncrementalText(gen.tokenizer) for _ in prompts]
    reference_logprobs: list[list[float] | None] = [None] * len(prompts)
    citer: SentenceCiter | None = None
    # Before this method is installed: the scorer runs its own on the same shared model. Nothing to cite when
    # nothing is generated (scoring, given answers' log-probabilities).
    t0 = time.perf_counter()
    nothing_cited = decode.max_new_tokens == 0 and not decode.forced
    cited_evidence = None if nothing_cited else _citation_evidence(gen, prompts, decode.calibrate)
    timings = {} if cited_evidence is None else {"cite_evidence_s": time.perf_counter() - t0}
    cite = gen.citations is not None
    with prepared(gen, prompts, cite=cite, calibrate=decode.calibrate, timings=timings) as ready:
        run, mixture, logits = ready.run, ready.mixture, ready.logits
        first_logits = logits
        if cite_as_you_go and cite:
            if decode.calibrate:  # the cache holds the prompt alone, as after decoding: the same maps
                run.content_free_maps()
            citer = SentenceCiter(gen, run, mixture, prompts, cited_evidence)
        yield from decode_tokens(run, mixture, rows, logits, decode, gen.eos_ids, gen.pad_id, citer)
        run.timings["decode_s"] = time.perf_counter() - ready.started
        segment_mass = read_answer_attention(run, rows, mixture.count)
        mix = None if mixture.instances is None else mixture.reference
        if decode.forced:
            reference_logprobs = force(run, rows, first_logits, reference_ids, mix, gen.tokenizer, cite)
            segment_mass = read_answer_attention(run, rows, mixture.count)
        elif any(r is not None for r in reference_ids):
            reference_logprobs = run.reference_logprobs(first_logits, reference_ids, mix)
    answers = []
    for b, prompt in enumerate(prompts):
        final = gen.tokenizer.decode(rows.generated[b], skip_special_tokens=True)
        if len(final) > len(rows.texts[b]):
            yield b, final[len(rows.texts[b]) :]
        mass = None if segment_mass is None else mixture.mass(segment_mass, b)
        cited = None if cited_evidence is None else cited_evidence[b]
        answers.append(
            _answer(gen, run, mixture, b, prompt, final, rows, mass, reference_logprobs[b], cited, decode.forced)
        )
    if citer is not None:  # the citations still due (the last sentence's, or a row's that ended mid-sentence)
        for b, answer in enumerate(answers):
            for citation in answer.citations[citer.emitted[b] :]:
                yield b, citation
    return answers


def check(gen: Answerer, prompts: list[StackedPrompt], decode: DecodeOptions) -> None:
    """Refuse sampling settings and prompts that cannot be answered, before anything runs."""
    if decode.temperature > 0 and not 0 < decode.top_p <= 1:
        share = "nucleus sampling keeps a share of the probability mass, in (0, 1]."
        raise InvalidArgumentError(share, (), Remedy("top_p", decode.top_p))
    max_new_tokens = check_max_new_tokens(decode.max_new_tokens)
    for prompt in prompts:
        if prompt.num_tokens + max_new_tokens > gen.context_window:
            raise InvalidArgumentError(
                f"the prompt ({prompt.num_tokens} tokens) and the answer (max_new_tokens={max_new_tokens}) exceed "
                f"the context window ({gen.context_window}); build the prompt with Generator.prompt(), which "
                "leaves room for the answer.",
                [Remedy("max_new_tokens", max(0, gen.context_window - prompt.num_tokens), "at most")],
            )


def _reference_ids(gen: Answerer, text: str | list[int]) -> list[int]:
    ids = list(text) if isinstance(text, list) else gen.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the reference answer is empty: pass a non-empty gold answer, or reference=None.")
    return ids


def _citation_evidence(
    gen: Answerer, prompts: list[StackedPrompt], calibrate: bool
) -> list[list[PassageEvidence]] | None:
    """Each prompt's passage evidence as `CitationConfig.evidence_from`'s method reads it (one prefill per
    prompt, batched); None where citations blend in the answering pass's own."""
    if gen.evidence_scorer is None:
        return None
    # A rule that blends in only the raw evidence (the default model's, measured) has no use for the
    # scorer's content-free pass.
    calibrate = calibrate and gen.citations.evidence_weight > 0
    return scored_evidence(gen.evidence_scorer, prompts, calibrate)


def _each_group(
    gen: Answerer,
    groups: list[list[int]],
    prompts: list[StackedPrompt],
    decode: DecodeOptions,
    reference_ids: list[list[int] | None],
    cancelled: Callable[[int], bool] | None,
    cite_as_you_go: bool,
) -> Steps:
    """`_batch_steps` on each group of rows in turn, its rows' events and Answers under the caller's row numbers."""
    answers: list[Answer | None] = [None] * len(prompts)
    for group in groups:
        steps = _batch_steps(
            gen,
            [prompts[i] for i in group],
            decode,
            [reference_ids[i] for i in group],
            None if cancelled is None else (lambda r, group=group: cancelled(group[r])),
            cite_as_you_go,
        )
        while True:
            try:
                row, event = next(steps)
            except StopIteration as finished:
                for i, answer in zip(group, finished.value, strict=True):
                    answers[i] = answer
                break
            yield group[row], event
    return answers


def pick(logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator | None) -> int:
    """One token from a row's logits: the argmax at temperature 0, else sampled (nucleus `top_p`)."""
    if temperature <= 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, idx = probs.sort(descending=True)
        keep = sorted_probs.cumsum(0) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, idx[keep], sorted_probs[keep])
    return int(torch.multinomial(probs, 1, generator=rng))


def decode_tokens(
    run: BatchRun,
    mixture: Mixture,
    rows: Rows,
    logits: torch.Tensor,
    decode: DecodeOptions,
    eos_ids: set[int],
    pad_id: int,
    citer: SentenceCiter | None = None,
) -> Iterator[tuple[int, str | Citation]]:
    """Pick, stream and feed back tokens until every row is done; yields (row, text delta) and, with a
    `citer`, (row, Citation) as each answer sentence ends."""
    temperature, top_p, stop_at_line_end, ignore_eos = (
        decode.temperature,
        decode.top_p,
        decode.stop_at_line_end,
        decode.ignore_eos,
    )
    while not all(rows.done):
        # Greedy rows all at once: one argmax and one device-to-host copy per step, not one per row (each a
        # synchronisation of the GPU stream: 32 per step at batch 32).
        # Each row's next-token distribution in fp32 (the answer's own confidence, read by
        # generators.answering.support).
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        greedy = logits.argmax(dim=-1).tolist() if temperature <= 0 else None
        top2 = logprobs.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).tolist()  # how decided the step was, whatever was picked
        # A greedy token is the argmax, so its log-probability is the top one (log-softmax keeps the order).
        chosen = top2[:, 0].tolist() if greedy is not None else None
        for b in range(len(rows.done)):
            if not rows.done[b] and rows.cancelled is not None and rows.cancelled(b):
                rows.done[b] = True  # the other rows never see this one: their answers do not change
            if rows.done[b]:
                continue
            token = greedy[b] if greedy is not None else pick(logits[b], temperature, top_p, rows.rngs[b])
            if not ignore_eos and token in eos_ids:
                rows.done[b] = True
                continue
            rows.generated[b].append(token)
            rows.logprobs[b].append(chosen[b] if chosen is not None else float(logprobs[b, token]))
            rows.margins[b].append(margins[b])
            new_text = rows.decoders[b].push(token)
            rows.ends[b].append(token_end(new_text, rows.ends[b]))  # citations.token_ends, as each prefix decodes
            if len(new_text) > len(rows.texts[b]) and not new_text.endswith("\ufffd"):
                yield b, new_text[len(rows.texts[b]) :]
                rows.texts[b] = new_text
                if citer is not None:
                    yield from citer.ended(b, rows.texts[b], rows.generated[b], rows.ends[b], rows.fed)
            if (stop_at_line_end and "\n" in rows.texts[b].lstrip()) or len(rows.generated[b]) == rows.limit:
                rows.done[b] = True
        if all(rows.done):
            break
        for b in range(len(rows.done)):
            rows.fed[b] += not rows.done[b]
        tokens = [g[-1] if not d else pad_id for g, d in zip(rows.generated, rows.done, strict=True)]
        logits = mixture.logits(run.step(mixture.rows(tokens)), live=[not d for d in rows.done])


def read_answer_attention(run: BatchRun, rows: Rows, count: int) -> list[torch.Tensor | None] | None:
    """Each batch row's mean answer maps (`maps.answer`) and, when citations are on, its per-token attention over
    the passages' headings and sentences [layers, H, fed, segments] (None where no token was fed back). Batch
    row r is an instance of prompt r // `count`, whose decoding state `rows` holds."""
    if not any(rows.fed):
        run.probe.score_rows([])
        return None
    taken = run.probe.take()
    segments = run.probe.take_answer_spans()
    run.probe.score_rows([])
    for r, maps in enumerate(run.maps):
        b = r // count
        passages = len(run.prompts[r].passages)
        if len(rows.generated[b]) > 1:
            maps.answer = taken[:, r, :, : rows.fed[b], :passages].mean(2)
    return segments_per_row(run, rows.fed, count, segments)


def force(
    run: BatchRun,
    rows: Rows,
    first_logits: torch.Tensor,
    answers: list[list[int] | None],
    mix: Callable[[torch.Tensor], torch.Tensor] | None,
    tokenizer,
    read: bool,
) -> list[list[float] | None]:
    """Given answers teacher-forced in one chunk after the prompts, their attention read as an answer's own
    (`read`: citations are on): `rows` then hold them as if decoded (tokens, character ends, log-probabilities,
    margins, the rows fed back), so the Answer, its evidence and its citations are assembled by the same code as
    a generated one's. Returns each answer's token log-probabilities."""
    t0 = time.perf_counter()
    logprobs, margins = run.teacher_forced(first_logits, answers, mix, read=read)
    run.timings["answer_s"] = time.perf_counter() - t0  # the answer's chunk: what checking adds to the prefill
    for b, ids in enumerate(answers):
        ids = ids or []
        rows.generated[b] = list(ids)
        rows.ends[b] = token_ends(tokenizer, rows.generated[b])
        rows.logprobs[b] = list(logprobs[b] or [])
        rows.margins[b] = list(margins[b] or [])
        rows.fed[b] = max(len(ids) - 1, 0)  # token j's query produced token j + 1; the last produced nothing
        rows.done[b] = True
    return logprobs


def _answer(
    gen: Answerer,
    run: BatchRun,
    mixture: Mixture,
    b: int,
    prompt: StackedPrompt,
    decoded: str,
    rows: Rows,
    segment_mass: torch.Tensor | None,
    reference_logprobs: list[float] | None,
    cited_evidence: list[PassageEvidence] | None = None,
    checked: bool = False,
) -> Answer:
    """Row `b`'s Answer. `cited_evidence`: the evidence citations blend in when it is not this pass's own
    (`evidence_from`); `checked`: the answer was given and teacher-forced (`attribute`), not generated."""
    ids, ends = rows.generated[b], rows.ends[b]
    text = decoded.strip()
    maps = mixture.maps(run.maps, b)
    passages = prompt_evidence(gen, prompt, maps)
    citations = []
    if gen.citations is not None:
        t0 = time.perf_counter()
        evidence = passages if cited_evidence is None else cited_evidence
        citations = cite_answer(gen, prompt, decoded, ids, segment_mass, evidence, ends)
        run.timings["cite_s"] = run.timings.get("cite_s", 0.0) + time.perf_counter() - t0
    answer = Answer(
        question=prompt.question,
        text=text,
        passages=passages,
        model=gen.loaded.name,
        method=gen.method.to_dict(),
        evidence_config=gen.evidence_config,
        prompt_tokens=prompt.num_tokens,
        generated_tokens=len(ids),
        timings=dict(run.timings),
        dropped=prompt.dropped,
        maps=maps,
        reference_logprob=None if reference_logprobs is None else sum(reference_logprobs),
        reference_token_logprobs=reference_logprobs,
        method_state=run.scratch[b * mixture.count],
        citations=citations,
        answer_ids=list(ids),
        token_logprobs=list(rows.logprobs[b]),
        token_margins=list(rows.margins[b]),
        checked=checked,
    )
    answer.support = gen.support_of(answer)
    return answer


def drain(
    steps: Steps,
    on_token: Callable[[int, str], None] | None,
    on_citation: Callable[[int, Citation], None] | None = None,
) -> list[Answer]:
    """Run the steps to their Answers, handing each event to its callback (with citations asked for, the steps
    hand over every Citation of every row exactly once, the ones still due when decoding ended last)."""
    while True:
        try:
            row, event = next(steps)
        except StopIteration as done:
            return done.value
        if isinstance(event, str):
            if on_token is not None:
                on_token(row, event)
        elif on_citation is not None:
            on_citation(row, event)


class GenerationStream:
    """Iterate for text deltas; `answer` holds the full Answer once iteration ends. `events()` also yields each
    answer sentence's Citation (citations on) as soon as the next sentence has begun, the last one at the end."""

    def __init__(self, steps: Iterator[tuple[int, str | Citation]]):
        self._steps = steps
        self.answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        for event in self.events():
            if isinstance(event, str):
                yield event

    def events(self) -> Iterator[str | Citation]:
        """Text deltas (str) and Citations in the order they became known, the last sentence's once decoding ends."""
        while True:
            try:
                _row, event = next(self._steps)
            except StopIteration as done:
                self.answer = done.value[0]
                return
            yield event


@dataclass
class Rows:
    """Per-row decoding state of one batch."""

    generated: list[list[int]]
    texts: list[str]  # each row's answer as streamed so far
    ends: list[list[int]]  # each row's decoded character end per generated token (citations.token_ends)
    done: list[bool]
    fed: list[int]  # decode steps that fed this row's token back (its answer-attention rows)
    rngs: list[torch.Generator | None]
    limit: int
    cancelled: Callable[[int], bool] | None = None  # row -> stop it now (its client left)
    decoders: list[IncrementalText] = field(default_factory=list)  # each row's text, decoded a few tokens a step
    logprobs: list[list[float]] = field(default_factory=list)  # each generated token's log-probability when picked
    margins: list[list[float]] = field(default_factory=list)  # top-1 minus top-2 log-probability at each step

    @classmethod
    def start(
        cls,
        batch: int,
        limit: int,
        sampled: bool,
        seed: int | None,
        device: torch.device,
        cancelled: Callable[[int], bool] | None = None,
    ) -> Rows:
        rngs = [torch.Generator(device).manual_seed(seed) if sampled else None for _ in range(batch)]
        return cls(
            [[] for _ in range(batch)],
            [""] * batch,
            [[] for _ in range(batch)],
            [limit == 0] * batch,
            [0] * batch,
            rngs,
            limit,
            cancelled,
            logprobs=[[] for _ in range(batch)],
            margins=[[] for _ in range(batch)],
        )
