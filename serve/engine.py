"""Requests -> stacked prompts -> the library's answer path (`rag.answering`), with no Ray in sight (the deployment
and the benchmark both drive it).

A request becomes a `Job` in the request's own path: its prompt is built and checked there, so a bad request is
refused alone with the library's message and never fails the batch it would have joined. A batch of jobs is split
into groups that share a method and the answering options that decide an answer (what one batch shares); each group
is answered through the library's one answer path (`rag.answering.Answering.answer`), one left-padded batch in which
every row is answered as it would be alone (text, evidence, sampling stream), restacked, verified and withheld
(abstaining) as the request's AnswerOptions say, as `Pipeline` answers them.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS, RESTACK_MEASURED, measured_restack_for
from midlens.core.errors import InvalidArgumentError, MidlensError, Remedies
from midlens.core.method_spec import check_cite_evidence
from midlens.core.passage import Passage
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.answer_wire import answer_to_wire, citation_to_wire
from midlens.generators.answering.citations import Citation, MeasuredCitations
from midlens.generators.answering.generator import Generator
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.generators.methods.registry import REGISTRY, MethodConfig, method_config
from midlens.generators.models.prompt import DEFAULT_STYLE, StackedPrompt, chat_prompt, check_style, read_user_content
from midlens.rag.answering import Answering
from midlens.rag.check_options import CheckOptions
from midlens.rag.option_fields import unstreamed
from midlens.rag.options import FIELDS, AnswerOptions
from midlens.rag.remote import AnswerRequest, CheckRequest, MidlensResult, PassageIn, ScoreRequest
from midlens.serve.schemas import ChatCompletionRequest

# How a prompt over the window is fixed through this API (PromptTooLongError.describe spells it per interface).
HTTP_REMEDIES = Remedies(
    room="the model's context window minus max_new_tokens",
    fewer="send at most {n} passages",
    drop='send "truncate": "drop_last" to keep the passages that fit',
    longer="serve a model with a longer context window",
    split="send shorter passages",
)


class ArtefactRefused(MidlensError):
    """A request named an artefact folder (only the server's operator chooses those)."""


ARTEFACT_REFUSED = (
    "a request cannot name an artefact folder: trained artefacts are chosen by this server's operator (midlens serve "
    "--method 'NAME(artefact=FOLDER)'). Name the method alone (e.g. 'mudaf'), which runs its shipped artefact."
)


def _names_a_folder(spec: str) -> bool:
    """Whether a method spec sets an `artefact` option (to anything: the refusal must not depend on the path)."""
    from midlens.core.method_spec import parse_method_spec

    try:
        _, options = parse_method_spec(spec)
    except Exception:  # noqa: BLE001 - a spec that does not parse is refused by method_config with its own words
        return False
    return options.get("artefact") is not None


# Generators of other methods share the loaded weights; a few are kept so a method asked for again is not rebuilt.
MAX_METHODS = 4


class ModelNotServed(MidlensError):
    """A request named a model this server does not run."""


class Cancelled(MidlensError):
    """A request was cancelled (timed out, or its client left) before its answer was complete: its row of the batch
    stopped decoding, or the whole batch did when nobody waited for any of its rows. `generated_tokens`: how far
    its row had got (None when the batch stopped as a whole or had not started)."""

    def __init__(self, problem: str, generated_tokens: int | None = None) -> None:
        self.generated_tokens = generated_tokens
        super().__init__(problem)


class _Stop(Exception):
    """Raised from the `cancelled` callback to leave `generate_batch` between two decode steps."""


@dataclass(frozen=True)
class Decoding:
    """What the rows of one `generate_batch` call share."""

    method: str
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    calibrate: bool
    restack: str | None = None  # the scorer's canonical spec; None: answered in the order given
    restack_rounds: int = 1
    # OpenAI's `stop`: the answer ends before the first of these after any leading whitespace; a line break among
    # them also stops decoding at the end of the first non-empty line.
    stop: tuple[str, ...] = ()
    # End at the end of the first non-empty line (AnswerOptions.stop_at_line_end, resolved for the served model).
    stop_at_line_end: bool = False
    # The request's options as a whole, what the answer path reads; the fields of it that decide an answer are
    # fields here too (the prompt's are the job's), so a group's rows share them and answer with any row's.
    answer: AnswerOptions = field(default_factory=AnswerOptions, compare=False, repr=False)
    # The rows are given answers to check (`Generator.attribute`), nothing is generated.
    check: bool = False
    # Each citation checked by ablation (AnswerOptions.verify; a check request's CheckOptions.verify).
    verify: bool = False
    # What decides withholding an answer (AnswerOptions' fields a stream cannot honour, rag.option_fields.unstreamed)
    # as (name, value) pairs: rows that withhold alike share a group.
    withholding: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Limits:
    """How much work one request may ask for: what keeps one client from holding a replica for minutes. Each is a
    `midlens serve` option; a request over one is refused (400) before anything is computed."""

    max_passages: int = 64
    max_prompt_tokens: int = 8192
    max_answer_tokens: int = 1024
    max_restack_rounds: int = 3
    max_method_cost: float = 8.0  # a method's cost (`Method.cost`: plain answers per answer) from its options

    def check_decoding(self, decoding: Decoding) -> None:
        if decoding.max_new_tokens > self.max_answer_tokens:
            raise TooMuchWork(
                f"max_tokens {decoding.max_new_tokens} is over this server's limit of {self.max_answer_tokens} "
                "(midlens serve --max-answer-tokens); ask for fewer."
            )
        if decoding.restack is not None and decoding.restack_rounds > self.max_restack_rounds:
            raise TooMuchWork(
                f"restack_rounds {decoding.restack_rounds} is over this server's limit of {self.max_restack_rounds} "
                "(midlens serve --max-restack-rounds)."
            )
        for spec in (decoding.method, decoding.restack):
            if spec is None:
                continue
            config = method_config(spec)
            cost = REGISTRY[config.name].cost
            work = 1.0 if cost is None else float(cost(config.options))
            if work > self.max_method_cost:
                raise TooMuchWork(
                    f"method {spec!r} costs about {work:g} plain answers per answer, over this server's limit of "
                    f"{self.max_method_cost:g} (midlens serve --max-method-cost); ask for fewer instances."
                )

    def check_passages(self, count: int) -> None:
        if count > self.max_passages:
            raise TooMuchWork(
                f"the request has {count} passages; this server takes at most {self.max_passages} per request "
                "(midlens serve --max-passages): send the best ones, or split the request."
            )

    def check_prompt(self, prompt: StackedPrompt) -> None:
        if prompt.num_tokens > self.max_prompt_tokens:
            raise TooMuchWork(
                f"the prompt is {prompt.num_tokens} tokens, over this server's limit of {self.max_prompt_tokens} "
                "(midlens serve --max-prompt-tokens): send fewer or shorter passages, or truncate='drop_last'.",
                code="context_length_exceeded",
            )


class TooMuchWork(MidlensError):
    """A request asks for more work than the server's limits allow. `code`: its error code on the wire (a prompt
    over the server's limit is too long for this server, as one over the window is: OpenAI clients that shorten a
    prompt on `context_length_exceeded` shorten it for this one too)."""

    def __init__(self, problem: str, code: str = "limit_exceeded") -> None:
        self.code = code
        super().__init__(problem)


@dataclass
class Job:
    """One request, ready to generate: its prompt, its decoding, and where its text deltas and its answer
    sentences' citations go (streaming)."""

    prompt: StackedPrompt
    decoding: Decoding
    on_token: Callable[[str], None] | None = None
    on_citation: Callable[[Citation], None] | None = None
    given: str | None = None  # the answer to check (`Decoding.check`)
    # Set from the event loop when nobody waits for the answer any more; read by the generation thread.
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Outcome:
    """A job's answer (or the error that its group raised) and how many rows its batch had."""

    answer: Answer | None
    error: BaseException | None
    batch_size: int


class Engine:
    def __init__(
        self,
        model: str = "smollm2-135m",
        method: str
        | None = None,  # None: the model's measured default (generators.models.packaged_models.default_method)
        device: str = "auto",
        dtype: str = "auto",
        evidence: EvidenceConfig | None = None,
        prompt_style: str = DEFAULT_STYLE,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        threads: int | None = None,
        cite_evidence: str | None = None,
        limits: Limits | None = None,
    ):
        """`cite_evidence`: every answer's citations blend in this method's evidence of the prompt (one more prefill
        per answer: `MeasuredCitations(evidence_from=...)`); None: the answering pass's own."""
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.prompt_style = check_style(prompt_style)
        self.max_new_tokens = max_new_tokens
        self.limits = limits or Limits()
        # Checked in this option's name, not as the library's evidence_from it becomes.
        self.citations = MeasuredCitations(check_cite_evidence(cite_evidence))
        self.default = Generator(
            model, method=method, evidence=evidence, device=device, dtype=dtype, citations=self.citations
        )
        # The answer path of each method served (its generator shares the loaded weights).
        self._answerings: dict[str, Answering] = {self.default.method.spec(): Answering(self.default)}
        self._lock = threading.Lock()
        self.batches: Counter[int] = Counter()  # size of every batch `run` was handed
        self.requests = 0
        self.cancelled = 0  # requests not answered (or not to the end) because they were cancelled

    @property
    def model_name(self) -> str:
        return self.default.loaded.name

    def spec(self) -> dict[str, Any]:
        loaded = self.default.loaded
        return {
            "model": loaded.name,
            "method": self.default.method.to_dict(),
            "method_spec": self.default.method.spec(),
            "restack": measured_restack_for(loaded.name, self.default.method.spec()),
            "cite_evidence": self.citations.evidence_from,
            "methods": list(REGISTRY),
            "context_window": self.default.context_window,
            "evidence_config": dataclasses.asdict(self.default.evidence_config),
            "device": str(self.default.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "max_new_tokens": self.max_new_tokens,
            "prompt_style": self.prompt_style,
        }

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "batches": dict(sorted(self.batches.items())),
            "requests": self.requests,
            "cancelled": self.cancelled,
        }

    # ---- requests -> jobs (in the request's path: errors are the request's own) ----

    def method_spec(self, method: str | None) -> str:
        """The canonical spec of a request's method (default: the server's); an unknown name or option raises the
        registry's error. A request never names a folder: an artefact is the operator's choice (`midlens serve
        --method`), so a spec with one is refused with the same words whatever the path, before anything reads it."""
        if method is None:
            return self.default.method.spec()
        config = method_config(method)
        spec = config.spec()
        if spec != self.default.method.spec() and config.options.get("artefact") is not None:
            raise ArtefactRefused(ARTEFACT_REFUSED)
        return spec

    def method_of_model(self, model: str | None) -> str | None:
        """OpenAI's `model` field: the served model's name, or NAME/METHOD-SPEC for another method on its weights."""
        if not model:
            return None
        name, _, spec = model.partition("/")
        if name != self.model_name:
            raise ModelNotServed(
                f"model {model!r} is not served here: this server runs {self.model_name!r} (ask for "
                f"{self.model_name!r}, or {self.model_name + '/METHOD-SPEC'!r} for another method on its weights)."
            )
        return spec or None

    def _decoding(self, method: str | None, options: dict[str, Any]) -> Decoding:
        """A request's options (its fields by AnswerOptions' names) as the decoding its rows share: checked by
        AnswerOptions, "measured" restacking resolved for this model and the request's method."""
        max_new = options.get("max_new_tokens")
        spec = self.method_spec(method)
        scorer = options.get("restack")
        if isinstance(scorer, str) and scorer != RESTACK_MEASURED and _names_a_folder(scorer):
            raise ArtefactRefused(ARTEFACT_REFUSED)
        set_here = {"method", "max_new_tokens", "restack", "seed"}
        given = {name: options[name] for name in FIELDS - set_here if options.get(name) is not None}
        answer = AnswerOptions(
            **given,
            max_new_tokens=self.max_new_tokens if max_new is None else max_new,
            restack=scorer,  # a request without passages has no restack field: nothing to restack
            seed=options.get("seed", 0),  # null is a seed of its own (unseeded), not the default
        )
        restack = answer.resolve(self.model_name, spec).restack
        return Decoding(
            method=spec,
            restack=None if restack is None else restack.scorer_spec,
            restack_rounds=1 if restack is None else restack.rounds,
            answer=answer,
            verify=answer.verify,
            withholding=tuple((name, getattr(answer, name)) for name in unstreamed()),
            **answer.decoding(self.default.tokenizer),
        )

    def _stacked(
        self,
        question: str,
        passages: Sequence[PassageIn],
        decoding: Decoding,
        truncate: str,
        style: str | None,
        max_prompt_tokens: int | None = None,
    ) -> StackedPrompt:
        # A cap on the prompt leaves the rest of the window unused, as the answer's room does.
        self.limits.check_passages(len(passages))
        self.limits.check_decoding(decoding)
        reserve = decoding.max_new_tokens
        if max_prompt_tokens is not None:
            reserve = max(reserve, self.default.context_window - max_prompt_tokens)
        prompt = self.default.prompt(
            question,
            [Passage(text=p.text, title=p.title, id=p.id, score=p.score) for p in passages],
            max_new_tokens=reserve,
            truncate=truncate,  # type: ignore[arg-type]
            style=check_style(style or self.prompt_style),
        )
        self.limits.check_prompt(prompt)
        return prompt

    def answer_job(self, request: AnswerRequest) -> Job:
        decoding = self._decoding(request.method, request.model_dump())
        return Job(
            self._stacked(request.question, request.passages, decoding, request.truncate, request.prompt_style),
            decoding,
        )

    def score_job(self, request: ScoreRequest) -> Job:
        decoding = self._decoding(request.method, {"max_new_tokens": 0, "calibrate": request.calibrate})
        prompt = self._stacked(
            request.question,
            request.passages,
            decoding,
            request.truncate,
            request.prompt_style,
            request.max_prompt_tokens,
        )
        return Job(prompt, decoding)

    def check_job(self, request: CheckRequest) -> Job:
        """An answer written elsewhere, checked over the passages as given: its length is the room the prompt
        leaves, bounded by the server's answer limit."""
        if not request.answer.strip():
            raise InvalidArgumentError("the answer to check is empty: send the text another model wrote in `answer`.")
        if not request.passages:
            raise InvalidArgumentError("no passages to check the answer against: send the ones it was written over.")
        tokens = len(self.default.tokenizer(request.answer, add_special_tokens=False)["input_ids"])
        if tokens > self.limits.max_answer_tokens:
            raise TooMuchWork(
                f"the answer is {tokens} tokens, over this server's limit of {self.limits.max_answer_tokens} "
                "(midlens serve --max-answer-tokens): check it a paragraph at a time."
            )
        room = self._decoding(request.method, {"max_new_tokens": tokens, "restack": None})
        prompt = self._stacked(request.question, request.passages, room, request.truncate, request.prompt_style)
        decoding = dataclasses.replace(room, max_new_tokens=0, check=True, verify=request.verify)
        return Job(prompt, decoding, given=request.answer)

    def chat_job(self, request: ChatCompletionRequest) -> Job:
        """Passages in the `midlens` extension: the RAG prompt over the last user message (evidence per passage).
        None: the conversation in the model's chat template, as MidlensLLM.chat does (no passages to score)."""
        stop = () if request.stop is None else (request.stop,) if isinstance(request.stop, str) else tuple(request.stop)
        if stop and request.stream:
            raise InvalidArgumentError("stop sequences cut a finished answer: ask without stream, or leave out `stop`.")
        ext = request.midlens
        method = (ext.method if ext and ext.method else None) or self.method_of_model(request.model)
        max_new = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        options: dict[str, Any] = {"max_new_tokens": max_new}
        for name in ("temperature", "top_p", "seed"):
            if getattr(request, name) is not None:
                options[name] = getattr(request, name)
        if ext is not None and ext.stop_at_line_end is not None:  # with passages or without
            options["stop_at_line_end"] = ext.stop_at_line_end
        if ext is not None and ext.passages is not None:
            if ext.calibrate is not None:
                options["calibrate"] = ext.calibrate
            # The extension's answering options by AnswerOptions' names (what only the server reads stays out).
            options.update(ext.model_dump(exclude={"passages", "method", "calibrate", "marked"}))
            decoding = dataclasses.replace(self._decoding(method, options), stop=stop)
            users = [m.text() for m in request.messages if m.role == "user"]
            if not users:
                raise InvalidArgumentError("the conversation has no user message: the last one is the question.")
            return Job(self._stacked(users[-1], ext.passages, decoding, ext.truncate, ext.prompt_style), decoding)
        if ext is not None and (ext.restack not in (None, RESTACK_MEASURED) or ext.restack_rounds != 1):
            raise InvalidArgumentError(
                "restack re-orders the passages of a RAG prompt, and this conversation has none: send them in "
                "midlens.passages, or leave out midlens.restack."
            )
        if ext is not None and ext.verify:
            raise InvalidArgumentError(
                "verify checks the answer's citations of passages, and this conversation has none: send them in "
                "midlens.passages, or leave out midlens.verify."
            )
        options["calibrate"] = False  # a chat has no passages to calibrate
        decoding = dataclasses.replace(self._decoding(method, options), stop=stop)
        stacked = self._read_back(request.messages, decoding)
        if stacked is not None:
            return Job(stacked, decoding)
        turns = [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            for m in request.messages
            if m.role in ("system", "developer", "user", "assistant")
        ]
        self.limits.check_decoding(decoding)
        window = self.default.context_window - decoding.max_new_tokens
        prompt = chat_prompt(self.default.tokenizer, turns, window)
        self.limits.check_prompt(prompt)
        return Job(prompt, decoding)

    def _read_back(self, messages: Sequence[Any], decoding: Decoding) -> StackedPrompt | None:
        """A conversation of one user turn written as midlens's own RAG prompt (what an outside harness sends of a
        midlens task, e.g. lm-evaluation-harness's local-chat-completions with midlens_mdqa): its passages and
        question stacked as `midlens.passages` would stack them, so the answer equals the in-process one."""
        turns = [m for m in messages if m.role != "system"]
        if len(turns) != 1 or turns[0].role != "user":
            return None
        read = read_user_content(turns[0].text())
        if read is None:
            return None
        style, passages, question = read
        sent = [PassageIn(id=p.id, text=p.text, title=p.title) for p in passages]
        return self._stacked(question, sent, decoding, "error", style)

    # ---- jobs -> answers (one thread: the model is installed for one method at a time) ----

    def _answering(self, spec: str) -> Answering:
        if spec not in self._answerings:
            if len(self._answerings) >= MAX_METHODS:  # the oldest other method goes; the default stays
                del self._answerings[next(k for k in self._answerings if k != self.default.method.spec())]
            config: MethodConfig = method_config(spec)
            evidence = self.default.evidence_config
            generator = Generator(self.default.loaded, method=config, evidence=evidence, citations=self.citations)
            self._answerings[spec] = Answering(generator)
        return self._answerings[spec]

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        """Answer a batch of jobs: one `generate_batch` per group of equal decoding. A group's error is handed to
        each of its jobs (never raised), so the other groups' answers still go out. A job cancelled before its
        group starts is left out of it; one cancelled while its group decodes stops at its next token while the
        others decode on unchanged, and a group whose jobs are all cancelled stops as a whole."""
        with self._lock:
            self.batches[len(jobs)] += 1
            self.requests += len(jobs)
            groups: dict[Decoding, list[int]] = {}
            outcomes: list[Outcome | None] = [None] * len(jobs)
            for i, job in enumerate(jobs):
                groups.setdefault(job.decoding, []).append(i)
            for decoding, group in groups.items():
                # Read now, not when the batch formed: a group waits for the groups before it.
                rows = [i for i in group if not jobs[i].cancelled]
                for i in set(group) - set(rows):
                    outcomes[i] = Outcome(None, Cancelled("the request was cancelled before it was answered."), 0)
                    self.cancelled += 1
                if not rows:
                    continue
                try:
                    answers = self._generate(decoding, [jobs[i] for i in rows])
                except Exception as err:  # noqa: BLE001 (handed to each request of the group)
                    if isinstance(err, Cancelled):
                        self.cancelled += len(rows)
                    for i in rows:
                        outcomes[i] = Outcome(None, err, len(rows))
                    continue
                for i, answer in zip(rows, answers, strict=True):
                    if isinstance(answer, Cancelled):
                        self.cancelled += 1
                        outcomes[i] = Outcome(None, answer, len(rows))
                    else:
                        outcomes[i] = Outcome(answer, None, len(rows))
            return [o for o in outcomes if o is not None]

    def _generate(self, decoding: Decoding, jobs: list[Job]) -> list[Answer | Cancelled]:
        """The jobs as one batch through the answer path: an Answer per job, or Cancelled for a job whose row was
        stopped before it was done (what it generated so far is nobody's answer). Raises Cancelled when every job
        is."""
        answering = self._answering(decoding.method)
        if decoding.check:  # one teacher-forced pass per batch (and the ablations): nothing to cancel between steps
            check = CheckOptions(verify=decoding.verify)  # the prompts were stacked with the request's other fields
            return answering.check([j.prompt for j in jobs], [j.given or "" for j in jobs], check)
        # Every row's options decide the same answer (Decoding's fields); a line break among the stop strings also
        # ends decoding at the end of the first non-empty line.
        options = decoding.answer
        if "\n" in decoding.stop and not decoding.stop_at_line_end:
            options = options.replace(stop_at_line_end=True)
        sinks = [job.on_token for job in jobs]
        citation_sinks = [job.on_citation for job in jobs]
        stopped: set[int] = set()

        def on_token(row: int, piece: str) -> None:
            if sinks[row] is not None:
                sinks[row](piece)

        def on_citation(row: int, citation: Citation) -> None:
            if citation_sinks[row] is not None:
                citation_sinks[row](citation)

        def cancelled(row: int) -> bool:
            # Asked before each of a row's decode steps, on this thread; the flag is set from the event loop.
            if not jobs[row].cancelled:
                return False
            if all(job.cancelled for job in jobs):  # nobody waits for any row: skip the evidence passes too
                raise _Stop
            stopped.add(row)  # this row ends here; generate_batch decodes the others as if it had never been
            return True

        answers: list[Answer] | None = None
        try:
            answers = answering.answer(
                [job.prompt for job in jobs],
                options,
                stop=decoding.stop,
                on_token=on_token,
                cancelled=cancelled,
                # Only a streamed request listens; the others' citations come with their answers either way.
                on_citation=on_citation if any(citation_sinks) else None,
            )
        except _Stop:
            pass
        # Raised outside the except block so nothing keeps the traceback, whose frames hold the decode loop's
        # tensors: they are freed here, before the next batch runs on this thread.
        if answers is None:
            raise Cancelled(f"decoding stopped: all {len(jobs)} request(s) of the batch were cancelled.")
        return [
            Cancelled(
                f"decoding stopped after {answer.generated_tokens} of at most {decoding.max_new_tokens} tokens: "
                "the request was cancelled while its batch ran.",
                answer.generated_tokens,
            )
            if row in stopped
            else answer
            for row, answer in enumerate(answers)
        ]


def citation_json(citation: Citation) -> dict[str, Any]:
    """One answer sentence's citation as responses carry it (generators.answering.answer_wire's form)."""
    return citation_to_wire(citation)


def result_of(answer: Answer, batch_size: int) -> MidlensResult:
    """An Answer as the `midlens` object of a response: its wire form (generators.answering.answer_wire; the question
    and text an answer response adds itself) and the size of the batch the server answered it in."""
    wire = answer_to_wire(answer)
    fields = {key: value for key, value in wire.items() if key in MidlensResult.model_fields}
    return MidlensResult.model_validate({**fields, "batch_size": batch_size})
