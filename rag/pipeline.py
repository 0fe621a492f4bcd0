"""The one pipeline every shell (CLI, LlamaIndex, demo, eval) calls: retrieve -> stack -> generate.

pipe = Pipeline.from_corpus(device="auto")         # embedded HotpotQA corpus, Qwen2.5-Coder-0.5B-Instruct, its default
answer = pipe.ask("Who directed Wings of Desire?")
for p in answer.ranked(): print(p.rank, p.passage.title, p.calibrated)
print(marked_answer(answer).text)                  # "... [1]." after each cited sentence

Every way of answering takes `verify=True`: the answer's citations are then checked by `Generator.verify` (each
cited passage removed, the answer re-scored) before the Answer is returned.

`restack="mudaf"` (generators.restack) scores the passages with that method's evidence, places the strongest in the
slots the model reads best and answers with the pipeline's method; answers stay numbered as retrieved. By default
(`restack="measured"`) a pipeline restacks where that was measured to help its model and method
(core.names.MEASURED_RESTACKS: SmolLM2's default); `restack=None` answers the passages in the order retrieved.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from midlens.core.batch_size import BatchSize, parse_batch_size, units_per_group
from midlens.core.checks import check_max_new_tokens, check_prompt_style, check_question, check_top_k
from midlens.core.errors import InvalidArgumentError
from midlens.core.names import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_RETRIEVAL,
    DEFAULT_TOP_K,
    RESTACK_MEASURED,
    Truncate,
)
from midlens.core.passage import Passage
from midlens.generators.answer import Answer
from midlens.generators.citations import Citation, CitationConfig, MeasuredCitations
from midlens.generators.evidence import EvidenceConfig
from midlens.generators.generator import GenerationStream, Generator
from midlens.generators.loading import LoadedModel
from midlens.generators.methods.registry import MethodConfig, method_config
from midlens.generators.packaged_models import DEFAULT_MODEL, default_method
from midlens.generators.prompt import DEFAULT_STYLE, StackedPrompt
from midlens.generators.restack import (
    RestackedStream,
    Restacker,
    RestackOption,
    check_restack_option,
    in_prompt_order,
    resolve_restack,
)
from midlens.generators.scheduling import generate_all
from midlens.generators.support import abstain
from midlens.retrievers.base import Retriever
from midlens.retrievers.build import Retrieval, build_retriever, check_retrieval
from midlens.retrievers.corpus import default_corpus_path
from midlens.retrievers.dense import IndexType


class Pipeline:
    def __init__(
        self,
        retriever: Retriever | None,
        generator: Generator,
        top_k: int = DEFAULT_TOP_K,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        truncate: Truncate = "error",
        prompt_style: str = DEFAULT_STYLE,
        restack: RestackOption = RESTACK_MEASURED,
        restack_rounds: int = 1,
        abstain: bool = False,
    ):
        """`abstain`: an answer whose support (`Answer.support`, generators.support) is below its model's threshold
        says ABSTAIN_TEXT instead, the answer it withheld kept in `Answer.withheld` (a stream carries the support
        once its text is out, and does not abstain). `prompt_style`: the instruction above the passages
        (generators.prompt.STYLES). `retriever=None`: a pipeline that answers over passages its caller retrieved
        (`answer`, `answer_stream`), as a LlamaIndex engine does with its own retriever. `restack`: the method whose
        evidence re-stacks the passages before each answer (a spec such as "mudaf", or a generators.restack.Restack),
        `restack_rounds` its scoring passes; None: the passages are answered in the order given; "measured" (the
        default): restacked where that was measured to help this model and method (core.names.MEASURED_RESTACKS),
        else in the order given. `self.restack` is what was chosen."""
        self.retriever = retriever
        self.generator = generator
        self.top_k = check_top_k(top_k)
        self.max_new_tokens = check_max_new_tokens(max_new_tokens)
        self.truncate = truncate
        self.prompt_style = check_prompt_style(prompt_style)
        if not isinstance(abstain, bool):
            raise InvalidArgumentError(f"abstain={abstain!r}: pass True (withhold unsupported answers) or False.")
        self.abstain = abstain
        # As asked (kept so that with_method re-resolves "measured" for its method), and as resolved.
        self.restack_option = check_restack_option(restack, restack_rounds)
        option = self.restack_option
        # Only "measured" reads the generator (a pipeline made to check its other arguments may have none).
        self.restack = (
            option
            if option != RESTACK_MEASURED
            else resolve_restack(option, generator.loaded.name, generator.method.spec())
        )
        # What answers: the generator, or the generator behind a restacker (same calls, same signatures).
        self.answerer: Generator | Restacker = generator if self.restack is None else Restacker(generator, self.restack)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | Path | None = None,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str | MethodConfig | None = None,
        top_k: int = DEFAULT_TOP_K,
        index_dir: str | Path | None = None,
        index_type: IndexType = "flat",
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        prompt_style: str = DEFAULT_STYLE,
        retrieval: Retrieval = DEFAULT_RETRIEVAL,
        truncate: Truncate = "error",
        restack: RestackOption = RESTACK_MEASURED,
        restack_rounds: int = 1,
        citations: CitationConfig | MeasuredCitations | Literal["measured"] | None = "measured",
        abstain: bool = False,
        **method_options,
    ) -> Pipeline:
        """`method` is a registry name or spec (None: the model's measured default, generators.packaged_models.
        default_method); `device`/`dtype`: auto = CUDA + bfloat16 when present, else CPU;
        `retrieval`: "dense" (faiss) or "hybrid" (dense + BM25 fused by rank, retrievers.hybrid); "+links" after
        either also stacks the passages whose titles the top 2 mention (retrievers.links); `restack`,
        `restack_rounds`: as in `Pipeline`; `citations`: as in `Generator`."""
        check_top_k(top_k)  # before the model loads
        check_prompt_style(prompt_style)
        check_retrieval(retrieval)
        # A bad spec fails before the index and the model.
        method = method_config(default_method(model) if method is None else method, method_options)
        restack = check_restack_option(restack, restack_rounds)  # so does a bad scorer or round count
        # Then the corpus: a missing or malformed one is reported before seconds of model loading.
        retriever = build_retriever(corpus or default_corpus_path(), retrieval, index_dir, index_type)
        generator = Generator(model, method=method, evidence=evidence, device=device, dtype=dtype, citations=citations)
        return cls(
            retriever,
            generator,
            top_k=top_k,
            truncate=truncate,
            prompt_style=prompt_style,
            restack=restack,
            abstain=abstain,
        )

    def with_method(self, method: str | MethodConfig, **method_options) -> Pipeline:
        """The same retriever and loaded model, another method (weights are shared, not reloaded), citing as this
        pipeline's generator was asked to (its measured rule resolved for the new method)."""
        generator = Generator(
            self.generator.loaded,
            method=method,
            evidence=self.generator.evidence_config,
            citations=self.generator.citation_setting,
            **method_options,
        )
        return Pipeline(
            self.retriever,
            generator,
            self.top_k,
            self.max_new_tokens,
            self.truncate,
            self.prompt_style,
            restack=self.restack_option,
            abstain=self.abstain,
        )

    def retrieve(self, question: str, top_k: int | None = None) -> list[Passage]:
        if self.retriever is None:
            raise InvalidArgumentError(
                "this pipeline has no retriever: pass the passages to answer() or answer_stream() instead."
            )
        # `top_k or self.top_k` would turn an explicit 0 into the default: only None means "the default".
        return self.retriever.search(question, self.top_k if top_k is None else check_top_k(top_k))

    def prompt(self, question: str, passages: list[Passage], max_new_tokens: int) -> StackedPrompt:
        """The stacked prompt this pipeline answers from (its truncation and instruction style)."""
        return self.generator.prompt(
            question, passages, max_new_tokens=max_new_tokens, truncate=self.truncate, style=self.prompt_style
        )

    def answer(
        self,
        question: str,
        passages: list[Passage],
        calibrate: bool = True,
        verify: bool = False,
        **generate_kwargs,
    ) -> Answer:
        """Generate over given passages (in the given prompt order), skipping retrieval. `verify`: check each
        citation (`Generator.verify`: the answer re-scored with the cited passage removed) before returning."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        self._check_verify(verify, max_new)
        prompt = self.prompt(question, passages, max_new)
        answer = self.answerer.generate(prompt, max_new_tokens=max_new, calibrate=calibrate, **generate_kwargs)
        if verify:
            self._verify([prompt], [answer])
        return self._abstained(answer)

    def ask(
        self,
        question: str,
        top_k: int | None = None,
        calibrate: bool = True,
        verify: bool = False,
        **generate_kwargs,
    ) -> Answer:
        """Retrieve, stack and answer; `verify` as in `answer`."""
        check_question(question)  # before retrieval, which would call it an empty query
        self._check_verify(verify, check_max_new_tokens(generate_kwargs.get("max_new_tokens", self.max_new_tokens)))
        t0 = time.perf_counter()
        passages = self.retrieve(question, top_k)
        retrieve_s = time.perf_counter() - t0
        answer = self.answer(question, passages, calibrate=calibrate, verify=verify, **generate_kwargs)
        answer.timings = {"retrieve_s": retrieve_s, **answer.timings}
        return answer

    def ask_many(
        self,
        questions: list[str],
        batch_size: BatchSize = 1,
        calibrate: bool = True,
        verify: bool = False,
        **generate_kwargs,
    ) -> list[Answer]:
        """`ask` for many questions, their prompts generated `batch_size` at a time (`auto`: the largest batch that
        fits on a GPU, 1 on the CPU); each Answer equals the question asked alone, citations included. `verify`
        checks every answer's citations, the re-scoring passes batched `batch_size` at a time as well."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        self._check_verify(verify, max_new)
        for question in questions:  # all before the first retrieval
            check_question(question)
        prompts, retrieve_s = [], []
        for question in questions:
            t0 = time.perf_counter()
            passages = self.retrieve(question)
            retrieve_s.append(time.perf_counter() - t0)
            prompts.append(self.prompt(question, passages, max_new))
        answers = generate_all(
            self.answerer, prompts, batch_size, max_new_tokens=max_new, calibrate=calibrate, **generate_kwargs
        )
        if verify:
            size = units_per_group(parse_batch_size(batch_size), self.generator.device.type)
            self._verify(prompts, answers, size)
        for answer, seconds in zip(answers, retrieve_s, strict=True):
            answer.timings = {"retrieve_s": seconds, **answer.timings}
            self._abstained(answer)
        return answers

    def _abstained(self, answer: Answer) -> Answer:
        """With `abstain`, an unsupported answer withheld (generators.support.abstain); once its citations were
        verified, by the support that read the drops."""
        if self.abstain:
            abstain(answer)
        return answer

    def answer_stream(
        self, question: str, passages: list[Passage], verify: bool = False, **generate_kwargs
    ) -> AnswerStream:
        """`answer` as text deltas; the prompt is built (and a too-long one refused) now, not on the first delta.
        `events()` yields each answer sentence's citation as soon as the next sentence begins; with `verify`, the
        citations come once the text has ended, verified (`AnswerStream.answer` holds them either way)."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        self._check_verify(verify, max_new)
        prompt = self.prompt(question, passages, max_new)
        stream = self.answerer.stream(prompt, max_new_tokens=max_new, **generate_kwargs)
        return AnswerStream(stream, (lambda answer: self._verify([prompt], [answer])) if verify else None)

    def ask_stream(
        self, question: str, top_k: int | None = None, verify: bool = False, **generate_kwargs
    ) -> AnswerStream:
        check_question(question)
        self._check_verify(verify, check_max_new_tokens(generate_kwargs.get("max_new_tokens", self.max_new_tokens)))
        return self.answer_stream(question, self.retrieve(question, top_k), verify=verify, **generate_kwargs)

    def verify(self, answers: list[Answer], batch_size: int = 8) -> list[Answer]:
        """Check the citations of answers this pipeline gave (`Generator.verify`), in place; returns them.

        Each answer's prompt is rebuilt from the passages it stacked (`Answer.passages`, in prompt order; a
        restacked answer's in the order its prompt held them) with this pipeline's instruction style: for an answer
        the pipeline just gave, the prompt it answered from, token for token. An interface that keeps only the
        Answer (a LlamaIndex engine) verifies through this."""
        if self.generator.citations is None:
            raise InvalidArgumentError(_CITATIONS_OFF)
        with in_prompt_order(answers):
            # The answer's own length as the room left: the prompt it came from fit with at least that much.
            prompts = [
                self.generator.prompt(
                    a.question, [pe.passage for pe in a.passages], a.generated_tokens, "error", self.prompt_style
                )
                for a in answers
            ]
            return self._verify(prompts, answers, batch_size)

    def _verify(self, prompts: list[StackedPrompt], answers: list[Answer], batch_size: int = 8) -> list[Answer]:
        if any(a.restack is not None and a.restack["numbering"] != "prompt" for a in answers):
            # Restacked answers came from prompts other than those built here: verify on the prompts answered.
            return self.verify(answers, batch_size)
        t0 = time.perf_counter()
        self.generator.verify(prompts, answers, batch_size=batch_size)
        seconds = time.perf_counter() - t0
        for answer in answers:  # one verification run for the batch: each answer reports its wall time
            answer.timings = {**answer.timings, "verify_s": seconds}
        return answers

    def _check_verify(self, verify: bool, max_new_tokens: int) -> None:
        """`verify` is refused before retrieval and generation where it cannot run."""
        if not isinstance(verify, bool):
            raise InvalidArgumentError(f"verify={verify!r}: pass True (check each citation) or False.")
        if not verify:
            return
        if self.generator is not None and self.generator.citations is None:
            raise InvalidArgumentError(_CITATIONS_OFF)
        if max_new_tokens == 0:
            raise InvalidArgumentError(
                "verify=True checks the citations of an answer, and max_new_tokens=0 generates none (it only scores "
                "the passages): pass max_new_tokens of 1 or more, or verify=False."
            )


_CITATIONS_OFF = (
    "verify=True checks the answer's citations, and this pipeline's generator has citations off "
    "(Generator(..., citations=None)): build it with citations=CitationConfig(), or pass verify=False."
)


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


@dataclass(frozen=True)
class MarkedAnswer:
    """An answer's text with its citation markers, and where each cited sentence now sits in it."""

    text: str
    spans: list[tuple[int, int]]  # per Answer.citations entry: its sentence in `text`, its marker included


CLOSING = ".!?;:。！？؟।…"  # a marker goes before a sentence's closing punctuation, as "... California [1]."


def citation_marker(citation: Citation, unverified: Literal["mark", "drop"] = "mark") -> str:
    """The marker of one answer sentence, "[1][3]": the prompt positions of the passages it cites, in prompt
    order. A source verification rejected reads "[1?]" (`unverified="mark"`) or is left out (`"drop"`); an
    unchecked source reads as cited."""
    positions = sorted(
        (s.position, s.verified is False)
        for s in citation.sources
        if not (unverified == "drop" and s.verified is False)
    )
    return "".join(f"[{p}{'?' if rejected else ''}]" for p, rejected in positions)


def marked_answer(answer: Answer, unverified: Literal["mark", "drop"] = "mark") -> MarkedAnswer:
    """The answer with a marker (`citation_marker`) after each cited sentence: "... at the Brea Mall in Brea,
    California [1]." The marker numbers are the passages' positions in the prompt, as `PassageEvidence.position`
    and the prompt's "Document [n]" lines number them."""
    text, out, spans, shift, pos = answer.text, [], [], 0, 0
    for citation in answer.citations:
        start, end = citation.span
        marker = citation_marker(citation, unverified)
        at = end
        while marker and at > start and text[at - 1] in CLOSING:
            at -= 1
        out.append(text[pos:at] + (" " + marker if marker else ""))
        pos = at
        spans.append((start + shift, end + shift + (len(marker) + 1 if marker else 0)))
        shift += len(marker) + 1 if marker else 0
    out.append(text[pos:])
    return MarkedAnswer("".join(out), spans)
