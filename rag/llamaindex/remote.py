"""The server side of `MidlensLLM.from_server("http://127.0.0.1:8000")`: its calls as requests to `midlens serve`, the
replies as the library's Answer and LlamaIndex's responses.

It talks to the server through `midlens.rag.remote` (the client and the wire format), never through the service.
RemoteMidlensLLM (rag/llamaindex/llm.py, the class `MidlensLLM.from_server(...)` builds) hands its calls to `Served`,
so it has the same LlamaIndex class, the same calls (complete / stream_complete / chat / stream_chat and their
async forms, passages=[nodes...]) and the same `additional_kwargs` (the Answer, its evidence rows) as a local
MidlensLLM: MidlensQueryEngine and any LlamaIndex code run unchanged against a server, with no model loaded here.
This module imports nothing from llm.py: what both build responses with lives in common.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
)
from pydantic import BaseModel

from midlens.core.defaults import RESTACK_MEASURED
from midlens.core.errors import InvalidArgumentError
from midlens.core.passage import Passage
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.answer_wire import answer_from_wire, citation_from_wire
from midlens.rag.llamaindex.common import _as_chat, _completion
from midlens.rag.option_fields import unstreamed
from midlens.rag.options import FIELDS, AnswerOptions
from midlens.rag.remote import AnswerRequest, ChatCompletionChunk, MidlensClient, MidlensResult, Spec, passage_json


def answer_of(result: MidlensResult, question: str, text: str, passages: Sequence[Passage] = ()) -> Answer:
    """A server's `midlens` object as the library's Answer, its passages those the caller sent (in prompt order;
    passages the server dropped come last), read by the wire form's one reader (generators.answering.answer_wire)."""
    return answer_from_wire(result.model_dump(), passages, question=question, text=text)


class Served:
    """A server's answers as LlamaIndex responses: each call of a MidlensLLM given `base_url` becomes a request
    (`midlens/answer`, or a chat completion with the `midlens` extension when streaming or chatting), and each reply
    the CompletionResponse or ChatResponse a local model would give, the Answer in its `additional_kwargs`."""

    def __init__(self, client: MidlensClient, spec: Spec) -> None:
        self.client = client
        self.spec = spec

    @staticmethod
    def _midlens(method: str, passages: Sequence[Passage] | None, options: AnswerOptions) -> dict[str, Any]:
        ext: dict[str, Any] = {"method": method, "calibrate": options.calibrate}
        if options.stop_at_line_end is not None:  # None: the served model's default
            ext["stop_at_line_end"] = options.stop_at_line_end
        if passages is not None:
            # As an answer request's, but for the decoding (OpenAI's fields) and abstaining (a stream carries the
            # support, it does not withhold: its text is out by then).
            fields = request_fields(options, AnswerRequest)
            for name in (*options.decoding(), *WITHHOLDING):
                if name != "stop_at_line_end":  # the extension's own field; the rest are OpenAI's
                    fields.pop(name, None)
            ext.update(passages=[passage_json(p) for p in passages], calibrate=options.calibrate, **fields)
        return ext

    @staticmethod
    def _openai(options: AnswerOptions) -> dict[str, Any]:
        return {
            "max_tokens": options.max_new_tokens,
            "temperature": options.temperature,
            "top_p": options.top_p,
            "seed": options.seed,
        }

    def complete(
        self, method: str, question: str, passages: list[Passage], options: AnswerOptions, marked: bool = False
    ) -> CompletionResponse:
        """`marked`: the text with "[n]" after each cited sentence, as `_completion(..., marked=True)` writes it."""
        fields = request_fields(options, AnswerRequest)
        out = self.client.answer(question, [passage_json(p) for p in passages], method=method, **fields)
        return _completion(answer_of(out, out.question, out.text, passages), marked=marked)

    def stream(
        self,
        method: str,
        messages: list[dict[str, Any]],
        passages: list[Passage] | None,
        options: AnswerOptions,
        question: str,
    ) -> CompletionResponseGen:
        """Token deltas and, as each answer sentence ends, a chunk with no delta whose additional_kwargs carry its
        Citation; then a last chunk whose additional_kwargs carry the evidence: what a local stream gives."""
        events = self.client.stream_chat(
            messages, **self._openai(options), midlens=self._midlens(method, passages, options)
        )
        first = next(events)  # sent now: a refused request raises at call time, not on the first next()

        def chunks() -> CompletionResponseGen:
            text = ""
            for event in _chain(first, events):
                if event.midlens_citation is not None:
                    citation = citation_from_wire(event.midlens_citation)
                    yield CompletionResponse(text=text, delta="", additional_kwargs={"citation": citation})
                    continue
                delta = event.choices[0].delta.content if event.choices else None
                if event.midlens is not None:
                    answer = answer_of(event.midlens, question, text + (delta or ""), passages or [])
                    yield _completion(answer, delta=delta or "")
                    return
                if delta:
                    text += delta
                    yield CompletionResponse(text=text, delta=delta)

        return chunks()

    def chat(self, method: str, turns: list[dict[str, Any]], options: AnswerOptions) -> ChatResponse:
        done = self.client.chat(turns, **self._openai(options), midlens=self._midlens(method, None, options))
        text = done.choices[0].message.content
        return _as_chat(_completion(answer_of(done.midlens, turns[-1]["content"], text)))

    def stream_chat(self, method: str, turns: list[dict[str, Any]], options: AnswerOptions) -> ChatResponseGen:
        return (_as_chat(c) for c in self.stream(method, turns, None, options, turns[-1]["content"]))


WITHHOLDING = unstreamed()  # what a stream does not do: its text is out before its support


def request_fields(options: AnswerOptions, request: type[BaseModel]) -> dict[str, Any]:
    """The options a server request of type `request` spells (by the same names), as its fields; the restacking as
    `restack_fields` words it."""
    names = (FIELDS & set(request.model_fields)) - {"method", "restack", "restack_rounds"}
    return {**{name: getattr(options, name) for name in names}, **restack_fields(options)}


def restack_fields(options: AnswerOptions) -> dict[str, Any]:
    """The options' restacking as a server request's fields: none for "measured" (the server's default resolves it
    for its model and method), `restack: null` for None. The server restacks by its model's measured slots: slots
    given here would not travel, so they are refused."""
    restack = options.restack
    if isinstance(restack, str):
        return {} if restack == RESTACK_MEASURED else {"restack": restack, "restack_rounds": options.restack_rounds}
    if restack is None:
        return {"restack": None}
    if getattr(restack, "slots", None) is not None:
        raise InvalidArgumentError(
            "Restack(slots=...) is not sent to a server: it restacks by its model's measured slots. Leave slots out, "
            "or restack with a MidlensLLM that runs the model here."
        )
    if hasattr(restack, "scorer_spec"):  # a Restack
        return {"restack": restack.scorer_spec, "restack_rounds": restack.rounds}
    return {"restack": restack.spec(), "restack_rounds": options.restack_rounds}  # a MethodConfig


def _chain(first: ChatCompletionChunk, rest: Iterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
    yield first
    yield from rest
