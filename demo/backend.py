"""The demo's backend: models, retrievers and per-method pipelines, each built once and shared by every visitor,
and the checks on what a visitor sends (`UserError` is shown as a message, never as a traceback). No Gradio here:
the page (`midlens.demo.app`) calls it, and tests drive it directly."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from midlens.core.defaults import DEFAULT_RESTACK_SCORER, is_measured_restack, measured_restack_for
from midlens.core.errors import CorpusError, MidlensError, Remedies
from midlens.rag.check_options import CheckOptions
from midlens.rag.options import AnswerOptions

if TYPE_CHECKING:  # torch loads slowly: only the requests themselves import it
    from midlens.core.passage import Passage
    from midlens.generators.answering.answer import Answer
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.base import Retriever

HOST = "127.0.0.1"
MAX_TOP_K = 10
# The fixes a too-long prompt's message offers, in the page's words (the page has no truncation switch).
REMEDIES = Remedies(
    room="the model's context window minus the answer's max new tokens",
    fewer="lower top-k to {n}",
    drop=None,
    longer="choose a model with a longer context window",
    split="upload a corpus with shorter passages",
)
MAX_QUESTION_CHARS = 1000
# "Check an answer": a pasted answer and pasted passages, bounded like an upload (each costs prompt tokens and time).
MAX_ANSWER_CHARS = 4000
MAX_PASTED_CHARS = 20_000
# What a checked answer's too-long prompt can change on that tab (the room left is the answer's own length).
CHECK_REMEDIES = Remedies(
    room="the model's context window minus the answer's length",
    fewer="check against at most {n} passages (lower how many passages, or paste fewer)",
    drop=None,
    longer="choose a model with a longer context window",
    split="paste shorter passages",
)
MAX_NEW_TOKENS = 128
DEFAULT_MAX_UPLOAD_MB = 2.0
UPLOAD_SUFFIXES = (".txt", ".md", ".jsonl")
UPLOADED_INDEXES_KEPT = 4  # each holds its passages and vectors in memory
DEFAULT_CORPUS = "default"


class UserError(Exception):
    """Bad input from the page; shown as a message, never as a traceback."""


class DemoBackend:
    """Models, retrievers and per-method pipelines, each built once and shared by every visitor.

    Results are never stored here: each request gets its own Answer objects (kept in that browser
    session's gr.State), so two visitors see their own results. Generation on one model is serialised
    by `LoadedModel.lock`; everything else runs concurrently under the Gradio queue.
    """

    def __init__(
        self,
        pipeline: Pipeline | None = None,
        corpus: str | Path | None = None,
        model: str | None = None,
        method: str | None = None,
        top_k: int | None = None,
        max_new_tokens: int | None = None,
        evidence: EvidenceConfig | None = None,
        max_upload_mb: float = DEFAULT_MAX_UPLOAD_MB,
        device: str = "auto",
        dtype: str = "auto",
        cite_evidence: str | None = None,
    ):
        """`top_k`, `max_new_tokens`: where the page's controls start (None: AnswerOptions' defaults; a given
        `pipeline`: its options). `cite_evidence`: every method's citations choose their passages with this method's
        evidence of the prompt (`MeasuredCitations(evidence_from=...)`; one more prefill per answer); a given
        `pipeline` cites as it does."""
        from midlens.core.defaults import METHOD_SHORTHANDS
        from midlens.generators.answering.citations import MeasuredCitations
        from midlens.generators.methods.registry import method_config
        from midlens.generators.models.packaged_models import DEFAULT_MODEL, REGISTRY, default_method

        self._lock = threading.RLock()
        self._bases: dict[str, Pipeline] = {}  # model name -> baseline-or-given pipeline on the startup corpus
        self._methods: dict[tuple[str, str], Pipeline] = {}
        self._retrievers: OrderedDict[str, Retriever] = OrderedDict()
        self.corpus = corpus
        self.evidence = evidence
        self.device, self.dtype = device, dtype
        self.citations = MeasuredCitations(cite_evidence)
        self.max_upload_bytes = int(max_upload_mb * 1024 * 1024)
        if pipeline is not None:
            name = pipeline.generator.loaded.name
            self._bases[name] = pipeline
            self._retrievers[DEFAULT_CORPUS] = pipeline.retriever
            self.model = name
            self.options = pipeline.options
            self.evidence = pipeline.generator.evidence_config
            self.citations = pipeline.generator.citation_setting
            method = pipeline.generator.method
        else:
            self.model = model or DEFAULT_MODEL
            given = {"top_k": top_k, "max_new_tokens": max_new_tokens}
            self.options = AnswerOptions().replace(**{k: v for k, v in given.items() if v is not None})
            method = method or default_method(self.model)
        self.models = list(dict.fromkeys([self.model, *REGISTRY]))
        # The startup spec's options (e.g. `ms-poe(ratio_max=1.4)`) apply whenever that method is picked.
        self.startup_method = method_config(method)
        # The menu entry the page starts on: a shorthand (`finetuned`) is an entry of its own, not its method's name.
        shorthand = isinstance(method, str) and method.strip() in METHOD_SHORTHANDS
        self.method = method.strip() if shorthand else self.startup_method.name

    @property
    def top_k(self) -> int:
        """Passages per question, until a visitor moves the slider."""
        return self.options.top_k

    @property
    def max_new_tokens(self) -> int:
        """The longest answer, until a visitor moves the slider."""
        return self.options.max_new_tokens

    # -- shared parts, built on first use -------------------------------------------------------

    def corpus_label(self) -> str:
        return "embedded HotpotQA paragraphs" if self.corpus is None else str(self.corpus)

    def retriever(self, corpus_file: str | None, progress: Any = None) -> tuple[Retriever, str]:
        """The startup corpus' retriever, or one for an uploaded file (indexed once, kept by content hash)."""
        from midlens.retrievers.build import build_retriever
        from midlens.retrievers.corpus import default_corpus_path

        if not corpus_file:
            with self._lock:
                if DEFAULT_CORPUS not in self._retrievers:
                    _progress(progress, 0.05, f"building the retrieval index for {self.corpus_label()}")
                    self._retrievers[DEFAULT_CORPUS] = build_retriever(self.corpus or default_corpus_path())
                return self._retrievers[DEFAULT_CORPUS], self.corpus_label()
        path = Path(corpus_file)
        name = path.name
        if path.suffix.lower() not in UPLOAD_SUFFIXES:
            raise UserError(f"corpus upload {name}: unsupported file type; upload a .txt, .md or .jsonl file.")
        size = path.stat().st_size
        if size > self.max_upload_bytes:
            raise UserError(
                f"corpus upload {name} is {_size(size)}; the demo indexes at most {_size(self.max_upload_bytes)} "
                "per upload. Upload a smaller file, or start `midlens demo --corpus PATH` (or raise "
                "--max-upload-mb) for a larger corpus."
            )
        key = hashlib.sha256(path.read_bytes()).hexdigest() + path.suffix.lower()
        with self._lock:
            if key not in self._retrievers:
                _progress(progress, 0.05, f"building the retrieval index for {name}")
                try:
                    self._retrievers[key] = build_retriever(path)
                except CorpusError as err:  # name the file the user chose, not the server's temp copy of it
                    raise UserError(str(err).replace(str(path), f"corpus upload {name}")) from None
                uploads = [k for k in self._retrievers if k != DEFAULT_CORPUS]
                for old in uploads[:-UPLOADED_INDEXES_KEPT]:
                    del self._retrievers[old]
            self._retrievers.move_to_end(key)
            return self._retrievers[key], f"uploaded {name}"

    def default_method_of(self, model: str) -> str:
        """The method a model answers with until the user picks another: its measured default."""
        from midlens.generators.models.packaged_models import default_method

        return default_method(model)

    def measured_restack(self, model: str, method: str) -> str | None:
        """The scorer `model` answering with `method` restacks by by default (core.defaults.MEASURED_RESTACKS), or
        None where restacking was not measured to help it."""
        from midlens.generators.methods.registry import method_config

        config = self.startup_method if method == self.method else method
        try:
            spec = method_config(config).spec()
        except MidlensError:  # a method not offered: asking with it says so
            return None
        return measured_restack_for(model, spec)

    def restacks(self, model: str, method: str) -> bool:
        """Whether the demo's options restack `model`'s answers with `method` (their `restack`; "measured": where
        restacking was measured to help them): what the page's "Re-order" switch starts at, and is set to again
        when the model or the method changes."""
        restack = self.options.restack
        if is_measured_restack(restack):
            return self.measured_restack(model, method) is not None
        return restack is not None

    def methods_of(self, model: str) -> list[str]:
        """The methods offered with `model`: one trained per model (MuDAF, MoICE) only where it ships for it."""
        from midlens.generators.methods.registry import available

        return available(model)

    def pipeline(
        self, model: str, method: str, corpus_file: str | None = None, progress: Any = None, restack: bool = False
    ) -> Pipeline:
        """A pipeline for (model, method) on the chosen corpus; methods share the model's weights. `restack`: the
        passages re-stacked before each answer by the evidence of the scorer measured for (model, method), else of
        the default scorer (core.defaults.DEFAULT_RESTACK_SCORER)."""
        from midlens.generators.answering.generator import Generator
        from midlens.generators.models.loading import load_model
        from midlens.rag.pipeline import Pipeline

        if model not in self.models:
            raise UserError(f"model {model!r} is not offered here; choose one of {', '.join(self.models)}.")
        offered = self.methods_of(model)
        if method not in offered:
            raise UserError(f"method {method!r} is not available with {model}; choose one of {', '.join(offered)}.")
        retriever, _ = self.retriever(corpus_file, progress)
        with self._lock:
            if model not in self._bases:
                _progress(progress, 0.15, f"loading model {model} (first use only)")
                loaded = load_model(model, self.device, self.dtype)
                generator = Generator(loaded, method="baseline", evidence=self.evidence, citations=self.citations)
                options = AnswerOptions(top_k=self.top_k, max_new_tokens=self.max_new_tokens, restack=None)
                self._bases[model] = Pipeline(retriever, generator, options)
            base = self._bases[model]
            if (model, method) not in self._methods:
                config = self.startup_method if method == self.method else method
                self._methods[(model, method)] = base.with_method(config)
            chosen = self._methods[(model, method)]
        restacked = (self.measured_restack(model, method) or DEFAULT_RESTACK_SCORER) if restack else None
        return Pipeline(retriever, chosen.generator, chosen.options.replace(restack=restacked))

    def prepare(self, progress: Any = None) -> str:
        """Load the startup model and index (on page load, so the first question does not wait)."""
        pipe = self.pipeline(self.model, self.method, None, progress)
        # What evidence means in numbers is under the page's Details; the first screen stays in plain words.
        return f"Ready: model **{self.model}**, corpus: {self.corpus_label()} ({len(pipe.retriever)} passages)."

    # -- one request ---------------------------------------------------------------------------

    def ask(
        self,
        question: str,
        model: str,
        method: str,
        compare: bool,
        top_k: float,
        corpus_file: str | None = None,
        max_new_tokens: float | None = None,
        check_citations: bool = False,
        restack: bool = False,
        abstain: bool = False,
        progress: Any = None,
    ) -> dict:
        """Retrieve once, answer with `method` (and with baseline on the same passages when comparing).
        `check_citations`: verify each answer's citations (Generator.verify: one more prefill per cited passage).
        `restack`: `method`'s answer reads the passages re-stacked by MuDAF's evidence (one more prefill); the
        side-by-side baseline reads them as retrieved, so the comparison is with the plain model as it is.
        `abstain`: an answer whose support is below its model's threshold is withheld
        (generators.answering.support.abstain)."""
        from midlens.core.errors import PromptTooLongError
        from midlens.demo.views import gold_titles, known_answers

        question = (question or "").strip()
        if not question:
            raise UserError("The question is empty: type a question (or click an example), then press Ask.")
        if len(question) > MAX_QUESTION_CHARS:
            raise UserError(f"The question is {len(question)} characters; keep it under {MAX_QUESTION_CHARS}.")
        k = _int_in_range("top-k", top_k, 1, MAX_TOP_K)
        new_tokens = _int_in_range("max new tokens", max_new_tokens or self.max_new_tokens, 1, MAX_NEW_TOKENS)
        try:
            pipe = self.pipeline(model, method, corpus_file, progress, restack=bool(restack))
            _progress(progress, 0.3, "retrieving passages")
            passages = pipe.retrieve(question, k)
            pipes = [pipe]
            if compare and method != "baseline":
                pipes.append(self.pipeline(model, "baseline", corpus_file, progress))
            answers = [
                self._answer(p, question, passages, new_tokens, check_citations, bool(abstain), progress) for p in pipes
            ]
        except PromptTooLongError as err:
            raise UserError(f"The prompt is too long for {model}: {err.describe(REMEDIES)}") from None
        except (MidlensError, ValueError) as err:
            raise UserError(str(err)) from None
        embedded = not corpus_file and self.corpus is None  # HotpotQA's labels hold only for its own corpus
        return {
            "question": question,
            "answers": answers,
            "gold": gold_titles(question) if embedded else [],
            "known": known_answers(question) if embedded else [],
            "compared": len(answers) > 1,
        }

    def check(
        self,
        question: str,
        answer: str,
        pasted: str,
        model: str,
        top_k: float,
        corpus_file: str | None = None,
        verify: bool = CheckOptions.verify,
        progress: Any = None,
    ) -> dict:
        """Check an answer written elsewhere (`Pipeline.check`) with `model` and the method the page starts with
        for it: over the pasted passages (blocks separated by a blank line) or, when none are pasted, over the
        `top_k` passages retrieved from the corpus. `verify`: each citation checked by removing its passage."""
        from midlens.core.errors import PromptTooLongError
        from midlens.demo.views import gold_titles

        question = (question or "").strip()
        if not question:
            raise UserError("The question is empty: type the question the answer replies to.")
        if len(question) > MAX_QUESTION_CHARS:
            raise UserError(f"The question is {len(question)} characters; keep it under {MAX_QUESTION_CHARS}.")
        answer = (answer or "").strip()
        if not answer:
            raise UserError("The answer to check is empty: paste the answer another model (or a person) wrote.")
        if len(answer) > MAX_ANSWER_CHARS:
            raise UserError(f"The answer is {len(answer)} characters; check at most {MAX_ANSWER_CHARS} at a time.")
        passages = pasted_passages(pasted)
        k = _int_in_range("top-k", top_k, 1, MAX_TOP_K)
        method = self.method if model == self.model else self.default_method_of(model)
        try:
            pipe = self.pipeline(model, method, corpus_file, progress)
            if not passages:
                _progress(progress, 0.3, "retrieving passages")
                passages = pipe.retrieve(question, k)
            doing = "reading the answer over the passages" + (", then without each cited passage" if verify else "")
            _progress(progress, 0.5, f"{doing} ({model}; waits if the model is busy)")
            checked = pipe.check(question, answer, passages, CheckOptions.like(pipe.options, verify=bool(verify)))
        except PromptTooLongError as err:
            raise UserError(f"The prompt is too long for {model}: {err.describe(CHECK_REMEDIES)}") from None
        except (MidlensError, ValueError) as err:
            raise UserError(str(err)) from None
        embedded = not pasted.strip() and not corpus_file and self.corpus is None
        return {"question": question, "answer": checked, "gold": gold_titles(question) if embedded else []}

    def _answer(
        self,
        pipe: Pipeline,
        question: str,
        passages: list[Passage],
        new_tokens: int,
        check: bool,
        abstain: bool,
        progress: Any,
    ) -> Answer:
        """One answer; with `check`, its citations verified against the very prompt it came from (Pipeline.answer's
        verify=True), their time under `verify_s`."""
        method = pipe.generator.method.name
        check = check and pipe.generator.citations is not None
        doing = f"generating with {method}" + (", then checking its citations" if check else "")
        done = [0]

        def on_token(_piece: str) -> None:
            done[0] += 1
            _progress(progress, (done[0], new_tokens), doing, unit="tokens")

        _progress(progress, (0, new_tokens), f"reading the prompt ({method}; waits if the model is busy)", "tokens")
        options = pipe.options.replace(max_new_tokens=new_tokens, verify=check, abstain=abstain)
        return pipe.answer(question, passages, options, on_token=on_token)


def pasted_passages(text: str | None) -> list[Passage]:
    """Passages pasted as text: one per block, blocks separated by a blank line, named "pasted n" in order."""
    from midlens.core.passage import Passage

    text = (text or "").strip()
    if len(text) > MAX_PASTED_CHARS:
        raise UserError(
            f"The pasted passages are {len(text)} characters; paste at most {MAX_PASTED_CHARS}, or upload them as a "
            "corpus and leave this box empty to retrieve from it."
        )
    blocks = [" ".join(b.split()) for b in re.split(r"\n\s*\n", text) if b.strip()]
    if len(blocks) > MAX_TOP_K:
        raise UserError(f"{len(blocks)} passages pasted; paste at most {MAX_TOP_K} (separated by a blank line).")
    return [Passage(text=b, title=f"pasted {i}", id=f"pasted-{i}") for i, b in enumerate(blocks, 1)]


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB" if n >= 1024 * 1024 else f"{n / 1024:.1f} KB"


def _progress(progress: Any, value: Any, desc: str, unit: str = "steps") -> None:
    if progress is not None:
        progress(value, desc=desc, unit=unit)


def _int_in_range(name: str, value: Any, lo: int, hi: int) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (number.is_integer() and lo <= number <= hi):
        raise UserError(f"{name} must be a whole number from {lo} to {hi}, got {value!r}.")
    return int(number)
