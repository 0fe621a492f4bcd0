"""The one pipeline every shell (CLI, LlamaIndex, demo, eval) calls: retrieve -> stack -> generate.

pipe = Pipeline.from_corpus(device="auto")         # embedded HotpotQA corpus, Qwen2.5-Coder-0.5B-Instruct, its default
answer = pipe.ask("Who directed Wings of Desire?")
for p in answer.ranked(): print(p.rank, p.passage.title, p.calibrated)
print(marked_answer(answer).text)                  # "... [1]." after each cited sentence

Every way of answering takes `verify=True`: the answer's citations are then checked by `Generator.verify` (each
cited passage removed, the answer re-scored) before the Answer is returned.

`restack="mudaf"` (generators.answering.restack) scores the passages with that method's evidence, places the strongest
in the slots the model reads best and answers with the pipeline's method; answers stay numbered as retrieved. By default
(`restack="measured"`) a pipeline restacks where that was measured to help its model and method
(core.defaults.MEASURED_RESTACKS; none passes out of domain today); `restack=None` answers the passages in the order
retrieved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from midlens.core.batch_size import BatchSize
from midlens.core.defaults import DEFAULT_RETRIEVAL
from midlens.core.errors import InvalidArgumentError
from midlens.core.passage import Passage
from midlens.core.validation import check_question, check_top_k
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.check_limits import answer_tokens
from midlens.generators.answering.citations import Citation, marker_order
from midlens.generators.answering.generator import Generator
from midlens.generators.answering.restack import Restacker, in_prompt_order
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.generators.methods.registry import MethodConfig, method_config
from midlens.generators.models.loading import LoadedModel, refuse_unrunnable
from midlens.generators.models.packaged_models import DEFAULT_MODEL, default_method
from midlens.generators.models.prompt import StackedPrompt
from midlens.rag.answering import CITATIONS_OFF, VERIFY_BATCH, Answering, AnswerStream, single_hooks
from midlens.rag.check_options import CheckOptions
from midlens.rag.options import FIELDS, AnswerOptions
from midlens.retrievers.base import Retriever
from midlens.retrievers.build import Retrieval, build_retriever, check_retrieval
from midlens.retrievers.corpus import default_corpus_path
from midlens.retrievers.dense import IndexType


class _Call(NamedTuple):
    """One call's options (checked against the generator) and the generation hooks passed through as given."""

    options: AnswerOptions
    hooks: dict[str, Any]


class Pipeline:
    """A retriever, a generator and the AnswerOptions it answers with (`options`; each call may change some:
    `pipe.ask(question, max_new_tokens=16)` answers with `options.replace(max_new_tokens=16)`)."""

    def __init__(
        self,
        retriever: Retriever | None,
        generator: Generator | None,
        options: AnswerOptions | None = None,
        **changes: Any,
    ):
        """`options` (rag.options.AnswerOptions; keywords change single fields of it). `retriever=None`: a pipeline
        that answers over passages its caller retrieved (`answer`, `answer_stream`), as a LlamaIndex engine does
        with its own retriever. `options.method` and `options.cite_evidence` describe the generator: None means its
        own; another method is refused (`with_method` answers with another method on the same weights). `restack`
        is what the options' restack resolved to for this generator's model and method."""
        self.retriever = retriever
        self.generator = generator
        self.options = (options or AnswerOptions()).replace(**changes)
        self.restack, self.answerer, self.answering = None, None, None
        if generator is None:  # a pipeline made to check its options
            return
        # Every call answers through the answer path all interfaces share (rag.answering).
        self.answering = Answering(generator)
        self.restack = self.answering.resolve(self.options).restack
        # What answers: the generator, or the generator behind a restacker (same calls, same signatures).
        self.answerer: Generator | Restacker = self.answering.answerer(self.restack)

    def _call(self, options: AnswerOptions | None, changes: dict[str, Any]) -> _Call:
        """One call's options (this pipeline's, `options` instead where given, `changes` on top) and the generation
        hooks among `changes` (on_token, reference, ...), passed as they are. The options are resolved for the
        generator here, before any retrieval, so a bad one fails first."""
        if options is not None and not isinstance(options, AnswerOptions):
            raise InvalidArgumentError(
                f"options={options!r}: pass an AnswerOptions (rag.options), or the options by keyword."
            )
        hooks = {k: v for k, v in changes.items() if k not in FIELDS}
        call = (options or self.options).replace(**{k: v for k, v in changes.items() if k in FIELDS})
        if self.answering is not None:
            self.answering.check_verify(call)
            if call != self.options:  # this pipeline's own options were resolved when it was made
                self.answering.answerer(self.answering.resolve(call).restack)
        return _Call(call, hooks)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | Path | None = None,
        model: str | LoadedModel = DEFAULT_MODEL,
        options: AnswerOptions | None = None,
        index_dir: str | Path | None = None,
        index_type: IndexType = "flat",
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        retrieval: Retrieval = DEFAULT_RETRIEVAL,
        citations: bool = True,
        method_options: dict[str, Any] | None = None,
        **changes: Any,
    ) -> Pipeline:
        """A pipeline over a corpus (None: the embedded HotpotQA paragraphs): its index built or loaded, `model`
        loaded with `options.method` (None: its measured default) and `options.cite_evidence`. `device`/`dtype`:
        auto = CUDA + bfloat16 when present, else CPU; `retrieval`: "dense" (faiss) or "hybrid" (dense + BM25
        fused by rank, retrievers.hybrid); "+links" after either also stacks the passages whose titles the top 2
        mention (retrievers.links); `citations=False`: no citations (nor support scores, which read them);
        `method_options`: options of the method over its spec's."""
        options = (options or AnswerOptions()).replace(**changes)  # every option checked before the model loads
        check_retrieval(retrieval)
        name = model if isinstance(model, str) else model.name
        method = method_config(options.method or default_method(name), method_options or {})
        resolved = options.resolve(name, method.spec())  # a bad restack scorer fails before the index and the model
        if isinstance(model, str):  # a model folder of a family the module cannot run: before the corpus's index
            refuse_unrunnable(model)
        # Then the corpus: a missing or malformed one is reported before seconds of model loading.
        retriever = build_retriever(corpus or default_corpus_path(), retrieval, index_dir, index_type)
        citing = resolved.citations if citations else None
        generator = Generator(model, method=method, evidence=evidence, device=device, dtype=dtype, citations=citing)
        return cls(retriever, generator, options.replace(method=None, cite_evidence=None))

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
        return Pipeline(self.retriever, generator, self.options.replace(method=None, cite_evidence=None))

    def retrieve(self, question: str, top_k: int | None = None) -> list[Passage]:
        if self.retriever is None:
            raise InvalidArgumentError(
                "this pipeline has no retriever: pass the passages to answer() or answer_stream() instead."
            )
        # `top_k or self.top_k` would turn an explicit 0 into the default: only None means "the default".
        return self.retriever.search(question, self.options.top_k if top_k is None else check_top_k(top_k))

    def prompt(self, question: str, passages: list[Passage], options: AnswerOptions | None = None) -> StackedPrompt:
        """The stacked prompt this pipeline answers from (its truncation, instruction style and answer room)."""
        return self.answering.prompt(question, passages, options or self.options)

    def answer(
        self, question: str, passages: list[Passage], options: AnswerOptions | None = None, **changes: Any
    ) -> Answer:
        """Generate over given passages (in the given prompt order), skipping retrieval. `verify`: check each
        citation (`Generator.verify`: the answer re-scored with the cited passage removed) before returning."""
        return self._answer(question, passages, self._call(options, changes))

    def _answer(self, question: str, passages: list[Passage], call: _Call) -> Answer:
        hooks, references = single_hooks(call.hooks)
        prompt = self.prompt(question, passages, call.options)
        return self.answering.answer([prompt], call.options, references=references, **hooks)[0]

    def ask(self, question: str, options: AnswerOptions | None = None, **changes: Any) -> Answer:
        """Retrieve (`top_k` passages), stack and answer; `verify` as in `answer`."""
        check_question(question)  # before retrieval, which would call it an empty query
        call = self._call(options, changes)  # every option checked (and resolved, once) before retrieval
        t0 = time.perf_counter()
        passages = self.retrieve(question, call.options.top_k)
        retrieve_s = time.perf_counter() - t0
        answer = self._answer(question, passages, call)
        answer.timings = {"retrieve_s": retrieve_s, **answer.timings}
        return answer

    def ask_many(
        self,
        questions: list[str],
        batch_size: BatchSize = 1,
        options: AnswerOptions | None = None,
        **changes: Any,
    ) -> list[Answer]:
        """`ask` for many questions, their prompts generated `batch_size` at a time (`auto`: the largest batch that
        fits on a GPU, 1 on the CPU); each Answer equals the question asked alone, citations included. `verify`
        checks every answer's citations, the re-scoring passes batched `batch_size` at a time as well."""
        o, hooks = self._call(options, changes)
        for question in questions:  # all before the first retrieval
            check_question(question)
        prompts, retrieve_s = [], []
        for question in questions:
            t0 = time.perf_counter()
            passages = self.retrieve(question, o.top_k)
            retrieve_s.append(time.perf_counter() - t0)
            prompts.append(self.prompt(question, passages, o))
        answers = self.answering.answer(prompts, o, batch_size, **hooks)
        for answer, seconds in zip(answers, retrieve_s, strict=True):
            answer.timings = {"retrieve_s": seconds, **answer.timings}
        return answers

    def check(
        self,
        question: str,
        answer: str,
        passages: list[Passage] | None = None,
        options: CheckOptions | None = None,
        **changes: Any,
    ) -> Answer:
        """Check an answer midlens did not write (`Answering.check`): its sentences' citations over `passages`
        (retrieved for `question` when None), in one teacher-forced pass; `options` (rag.check_options.CheckOptions;
        keywords change single fields; None: the ones this pipeline's answers would stack with, `CheckOptions.like`)
        and its `verify` (on by default) checks each citation by ablation. The passages are stacked in the order
        given (never restacked: the answer was written over them as they are); `support` is the checked-answer
        support model's (generators.answering.check: each sentence's probability of being right, the answer's its
        weakest sentence's), shipped for SmolLM2-135M and Qwen2.5-Coder-0.5B (generators/trained/support-checked/);
        None for any other model. The pipeline's generator is the reader: `options.model` is for the shells that
        load one."""
        if options is not None and not isinstance(options, CheckOptions):
            raise InvalidArgumentError(
                f"options={options!r}: pass a CheckOptions (rag.check_options), or the options by keyword."
            )
        o = (options or CheckOptions.like(self.options)).replace(**changes)
        check_question(question)
        if not isinstance(answer, str) or not answer.strip():
            raise InvalidArgumentError(
                f"the answer to check is empty ({answer!r}): pass the text another model (or a person) wrote."
            )
        if passages is None and self.retriever is None:
            raise InvalidArgumentError(
                "no passages to check the answer against: this pipeline has no retriever; pass passages=[...] "
                "(or build the pipeline over a corpus)."
            )
        self.answering.check_verify(o)
        # Measured first: an answer over the window is refused before retrieval.
        generator = self.generator
        answer_tokens(generator.tokenizer, answer, generator.context_window, generator.loaded.name)
        retrieved, t0 = passages is None, time.perf_counter()
        if retrieved:
            passages = self.retrieve(question, o.top_k)
        retrieve_s = time.perf_counter() - t0
        if not passages:
            raise InvalidArgumentError("no passages to check the answer against: pass at least one passage.")
        prompt = self.answering.check_prompt(question, passages, answer, o)
        checked = self.answering.check([prompt], [answer], o)[0]
        if retrieved:
            checked.timings = {"retrieve_s": retrieve_s, **checked.timings}
        return checked

    def answer_stream(
        self, question: str, passages: list[Passage], options: AnswerOptions | None = None, **changes: Any
    ) -> AnswerStream:
        """`answer` as text deltas; the prompt is built (and a too-long one refused) now, not on the first delta.
        `events()` yields each answer sentence's citation as soon as the next sentence begins; with `verify`, the
        citations come once the text has ended, verified (`AnswerStream.answer` holds them either way). A stream
        carries the support once its text is out, and does not abstain."""
        return self._answer_stream(question, passages, self._call(options, changes))

    def _answer_stream(self, question: str, passages: list[Passage], call: _Call) -> AnswerStream:
        return self.answering.stream(self.prompt(question, passages, call.options), call.options, **call.hooks)

    def ask_stream(self, question: str, options: AnswerOptions | None = None, **changes: Any) -> AnswerStream:
        check_question(question)
        call = self._call(options, changes)
        return self._answer_stream(question, self.retrieve(question, call.options.top_k), call)

    def verify(self, answers: list[Answer], batch_size: int = VERIFY_BATCH) -> list[Answer]:
        """Check the citations of answers this pipeline gave (`Generator.verify`), in place; returns them.

        Each answer's prompt is rebuilt from the passages it stacked (`Answer.passages`, in prompt order; a
        restacked answer's in the order its prompt held them) with this pipeline's instruction style: for an answer
        the pipeline just gave, the prompt it answered from, token for token. An interface that keeps only the
        Answer (a LlamaIndex engine) verifies through this."""
        if self.generator.citations is None:
            raise InvalidArgumentError(CITATIONS_OFF)
        with in_prompt_order(answers):
            prompts = self.answering.rebuilt(answers, [self.options.prompt_style] * len(answers))
            return self.answering.verify(prompts, answers, batch_size)


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
    return "".join(
        f"[{s.position}{'?' if s.verified is False else ''}]"
        for s in marker_order(citation.sources)
        if not (unverified == "drop" and s.verified is False)
    )


def marked_answer(answer: Answer, unverified: Literal["mark", "drop"] = "mark") -> MarkedAnswer:
    """The answer with a marker (`citation_marker`) after each cited sentence: "... at the Brea Mall in Brea,
    California [1]." The marker numbers are the passages' positions in the prompt, as `PassageEvidence.position`
    and the prompt's "Document [n]" lines number them."""
    return marked_text(answer.text, answer.citations, unverified)


def marked_text(text: str, citations: list[Citation], unverified: Literal["mark", "drop"] = "mark") -> MarkedAnswer:
    """`marked_answer` of a text and its sentences' citations: a streamed answer's so far, the sentences cited by
    then (the marked text up to the last one's `spans` end is then the finished answer's)."""
    out, spans, shift, pos = [], [], 0, 0
    for citation in citations:
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
