"""The one answer path: stacked prompts (a question over its passages) and `AnswerOptions` in, Answers out, batched.

    answering = Answering(Generator("smollm2-135m"))
    options = AnswerOptions(verify=True, abstain=True)
    prompts = [answering.prompt(question, passages, options) for question, passages in asked]
    answers = answering.answer(prompts, options, batch_size=4)

Every interface answers through `Answering.answer` (a stream through `Answering.stream`): `Pipeline` (`ask`,
`answer`, `ask_many`, `answer_stream`, `ask_stream`), the eval plan's end-to-end and position-sweep evaluators, and
the server's engine. An answer written elsewhere is checked through `Answering.check` (`CheckOptions`):
`Pipeline.check`, the server, the LlamaIndex evaluator and checked engine, the demo's check tab and `midlens check`.
So what happens to an answer is decided once: which generator answers (the one given, or a `Restacker` over it
where the options restack), the decoding the options spell for the model, the citations checked by ablation
(`verify`) and abstaining (`abstain`, at `abstain_below` or else the model's own threshold). What an
interface adds stays with it: retrieval (Pipeline), a server's limits, stop strings and cancellation (given here as
hooks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from midlens.core.batch_size import BatchSize, parse_batch_size, units_per_group
from midlens.core.errors import InvalidArgumentError, Remedy
from midlens.core.passage import Passage
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.check_limits import answer_tokens
from midlens.generators.answering.citations import Citation
from midlens.generators.answering.detokenize import cut_at_stop
from midlens.generators.answering.generator import GenerationStream, Generator
from midlens.generators.answering.restack import Restack, RestackedStream, Restacker, in_prompt_order
from midlens.generators.answering.scheduling import generate_all
from midlens.generators.models.prompt import StackedPrompt
from midlens.rag.check_options import CheckOptions
from midlens.rag.options import AnswerOptions, ResolvedOptions

CITATIONS_OFF = (
    "verify=True checks the answer's citations, and this generator has citations off "
    "(Generator(..., citations=None)): build it with citations=CitationConfig(), or pass verify=False."
)

# What Generator.verify checks at once when the caller gave no batch size (its own default).
VERIFY_BATCH = 8


class Answering:
    """Answers with one generator (its loaded model, method and citation setting) under any AnswerOptions whose
    method and citation evidence are that generator's; restacking, decoding, `verify` and `abstain` vary per call."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        # A Restacker holds the measured slot order and the scorer's generator: made once per restack setting.
        self._restackers: dict[tuple, Restacker] = {}

    def resolve(self, options: AnswerOptions) -> ResolvedOptions:
        """The options made concrete for this generator; a method or citation evidence other than its own is
        refused (another method is another generator on the same weights)."""
        generator = self.generator
        running = generator.method.spec()
        resolved = options.resolve(generator.loaded.name, running)
        # Only a method the options name can differ from the generator's (None means the generator's own).
        if options.method is not None and resolved.method.spec() != running:
            raise InvalidArgumentError(
                f"this generator runs {running}, and the options ask for {options.method}: answer with a generator "
                "of that method (Pipeline.with_method(...) shares the weights), or leave method out.",
                about=Remedy("method", options.method),
            )
        setting = getattr(generator.citations, "evidence_from", None)
        if options.cite_evidence is not None and options.cite_evidence != setting:
            raise InvalidArgumentError(
                f"this generator cites with {setting or 'its own'} evidence; the citation evidence is the "
                "generator's (Generator(..., citations=MeasuredCitations(evidence_from=...))), leave it out here.",
                about=Remedy("cite_evidence", options.cite_evidence),
            )
        return resolved

    def check_verify(self, options: AnswerOptions | CheckOptions) -> None:
        """`verify` is refused before anything runs where it cannot: this generator has citations off."""
        if options.verify and self.generator.citations is None:
            raise InvalidArgumentError(CITATIONS_OFF)

    def answerer(self, restack: Restack | None) -> Generator | Restacker:
        """What answers: the generator, or a Restacker over it (same calls, same signatures)."""
        if restack is None:
            return self.generator
        key = (restack.scorer_spec, restack.rounds, restack.slots)
        if key not in self._restackers:
            self._restackers[key] = Restacker(self.generator, restack)
        return self._restackers[key]

    def prompt(self, question: str, passages: list[Passage], options: AnswerOptions) -> StackedPrompt:
        """The stacked prompt the options answer from (their truncation, instruction style and answer room)."""
        return self.generator.prompt(
            question,
            passages,
            max_new_tokens=options.max_new_tokens,
            truncate=options.truncate,
            style=options.prompt_style,
        )

    def answer(
        self,
        prompts: Sequence[StackedPrompt],
        options: AnswerOptions,
        batch_size: BatchSize | None = None,
        references: Sequence[str | list[int] | None] | None = None,
        stop: Sequence[str] = (),
        **hooks: Any,
    ) -> list[Answer]:
        """One Answer per prompt, in order. `batch_size` None: the prompts are one batch, answered in the order
        given (what a server formed); else `generate_all`'s batches (`auto`: the largest that fits). `references`:
        a gold answer per prompt, scored as well. `stop`: strings the answer ends before (OpenAI's `stop`), cut
        before verification and abstaining read it. `hooks` go to `Generator.generate_batch` as they are
        (`on_token(row, piece)`, `on_citation(row, citation)`, `cancelled(row)`, `ignore_eos`). Then `verify`
        checks each citation by ablation and `abstain` withholds an answer under the threshold in force."""
        self.check_verify(options)
        answerer = self.answerer(self.resolve(options).restack)
        decoding = options.decoding(self.generator.tokenizer)
        prompts = list(prompts)
        refs = list(references) if references is not None else [None] * len(prompts)
        if batch_size is None:
            answers = answerer.generate_batch(prompts, references=refs, **decoding, **hooks)
        else:
            answers = generate_all(answerer, prompts, batch_size, refs, **decoding, **hooks)
        if stop:
            answers = [stopped_at(answer, tuple(stop)) for answer in answers]
        if options.verify:
            size = VERIFY_BATCH if batch_size is None else self._group(batch_size)
            self.verify(prompts, answers, size)
        for answer in answers:
            options.withhold(answer)
        return answers

    def stream(self, prompt: StackedPrompt, options: AnswerOptions, **hooks: Any) -> AnswerStream:
        """`answer` for one prompt as text deltas (`hooks`: `Generator.stream`'s, e.g. `reference`). With `verify`
        the citations come once the text has ended, verified; a stream does not abstain (its text is out before
        its support is known: `AnswerStream.answer` carries the support)."""
        self.check_verify(options)
        answerer = self.answerer(self.resolve(options).restack)
        stream = answerer.stream(prompt, **options.decoding(self.generator.tokenizer), **hooks)
        return AnswerStream(stream, (lambda answer: self.verify([prompt], [answer])) if options.verify else None)

    def check_prompt(self, question: str, passages: list[Passage], text: str, options: CheckOptions) -> StackedPrompt:
        """The prompt an answer written elsewhere is read after: the passages stacked in the order given (never
        restacked: the answer was written over them as they are) with the answer's own length as the room left, so
        passages are truncated (or refused) as they would be for an answer that long. An answer over the context
        window is refused here, by the tokenizer alone."""
        generator = self.generator
        room = answer_tokens(generator.tokenizer, text, generator.context_window, generator.loaded.name)
        return generator.prompt(question, passages, room, options.truncate, options.prompt_style)

    def check(
        self,
        prompts: Sequence[StackedPrompt],
        texts: Sequence[str],
        options: CheckOptions,
        batch_size: BatchSize | None = None,
    ) -> list[Answer]:
        """Answers written elsewhere, one per prompt, read by this generator: each text teacher-forced after its
        prompt in one pass (`Generator.attribute_batch`), its sentences cited; with `options.verify` each citation
        is checked by ablation as a generated answer's is (`verify`, timed under `verify_s`). `batch_size` None:
        VERIFY_BATCH at a time."""
        self.check_verify(options)
        size = VERIFY_BATCH if batch_size is None else self._group(batch_size)
        prompts = list(prompts)
        checked = self.generator.attribute_batch(prompts, list(texts), verify=False, batch_size=size)
        if options.verify:
            self.verify(prompts, checked, size)
        return checked

    def _group(self, batch_size: BatchSize) -> int:
        return units_per_group(parse_batch_size(batch_size), self.generator.device.type)

    def verify(
        self, prompts: list[StackedPrompt], answers: list[Answer], batch_size: int = VERIFY_BATCH
    ) -> list[Answer]:
        """Check the answers' citations (`Generator.verify`), in place; each answer's `timings["verify_s"]` is the
        wall time of the one verification run. A restacked answer was answered from its restacked prompt: the
        prompts are then rebuilt from the passages the answers stacked (`rebuilt`), in each prompt's style."""
        if any(a.restack is not None and a.restack["numbering"] != "prompt" for a in answers):
            with in_prompt_order(answers):
                return self.verify(self.rebuilt(answers, [p.style for p in prompts]), answers, batch_size)
        if self.generator.citations is None:
            raise InvalidArgumentError(CITATIONS_OFF)
        t0 = time.perf_counter()
        self.generator.verify(prompts, answers, batch_size=batch_size)
        seconds = time.perf_counter() - t0
        for answer in answers:
            answer.timings = {**answer.timings, "verify_s": seconds}
        return answers

    def rebuilt(self, answers: list[Answer], styles: Sequence[str]) -> list[StackedPrompt]:
        """Each answer's prompt rebuilt from the passages it stacked (`Answer.passages` in prompt order, as
        `in_prompt_order` numbers them), with the answer's own length as the room left (the prompt it came from fit
        with at least that much): for an answer given here, the prompt it answered from, token for token."""
        return [
            self.generator.prompt(a.question, [pe.passage for pe in a.passages], a.generated_tokens, "error", style)
            for a, style in zip(answers, styles, strict=True)
        ]


class AnswerStream:
    """A streamed answer: iterate for the text deltas while it is decoded; once they end, `answer` holds the full
    Answer, its citations verified when the stream was asked to. `events()` yields the text deltas and each answer
    sentence's `Citation`, in answer order: a sentence's citation right after the delta that began the next
    sentence (the last one's at the end), read from the answer's attention so far. Verification re-scores the
    finished answer, so a verified stream yields its citations after the text instead."""

    def __init__(
        self, stream: GenerationStream | RestackedStream, finish: Callable[[Answer], object] | None = None
    ) -> None:
        self._stream = stream
        self._finish = finish
        self.answer: Answer | None = None

    def __iter__(self) -> Iterator[str]:
        yield from self._stream
        answer = self._stream.answer
        if self._finish is not None and answer is not None:
            self._finish(answer)
        self.answer = answer

    def events(self) -> Iterator[str | Citation]:
        """The text deltas (str) and one Citation per answer sentence, in order (its `span` indexes `answer.text`,
        which equals the joined deltas stripped of surrounding whitespace)."""
        if self._finish is not None:  # verified: only the finished answer can be re-scored
            yield from self
            yield from self.answer.citations if self.answer is not None else ()
            return
        for event in self._stream.events():  # the stream yields the citations still due once decoding ends
            self.answer = self._stream.answer
            yield event
        self.answer = self._stream.answer


def stopped_at(answer: Answer, stop: tuple[str, ...]) -> Answer:
    """The answer cut before its first stop string (generators.answering.detokenize.cut_at_stop), keeping the citations
    of the sentences that end within what is left."""
    cut = cut_at_stop(answer.text, stop)
    if cut == answer.text:
        return answer
    answer.text = cut.rstrip()
    answer.citations = [c for c in answer.citations if c.span[1] <= len(answer.text)]
    return answer


def single_hooks(hooks: dict[str, Any]) -> tuple[dict[str, Any], list[str | None]]:
    """`Generator.generate`'s hooks for one prompt (`on_token(piece)`, `on_citation(citation)`, `reference`) as
    `Answering.answer`'s row hooks and references."""
    out = dict(hooks)
    reference = out.pop("reference", None)
    for name in ("on_token", "on_citation"):
        callback: Callable[[Any], None] | None = out.get(name)
        if callback is not None:
            out[name] = _for_row(callback)
    return out, [reference]


def _for_row(callback: Callable[[Any], None]) -> Callable[[int, Any], None]:
    return lambda _row, value: callback(value)
