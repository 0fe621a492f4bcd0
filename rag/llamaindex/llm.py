"""MidlensLLM: a LlamaIndex CustomLLM over the midlens Generator; evidence in `additional_kwargs`.

RemoteMidlensLLM, what `MidlensLLM.from_server(base_url)` builds, is the same class answered by a `midlens serve`
server (its requests and replies are `remote.Served`'s); both build their responses with common.py's helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr, model_validator
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback

from midlens.core.errors import InvalidArgumentError
from midlens.core.method_spec import check_cite_evidence
from midlens.core.passage import Passage
from midlens.rag.llamaindex.citation_blocks import answer_blocks, citable_request, citation_blocks
from midlens.rag.llamaindex.common import (
    GeneratorBacked,
    _as_chat,
    _as_completion,
    _completion,
    _drain_in_thread,
    logger,
    note_llm_model,
    to_passage,
)
from midlens.rag.llamaindex.stock_prompts import (
    STOCK_SYSTEM_PROMPTS,
    StockRequest,
    read_condense_prompt,
    read_stock_prompt,
)
from midlens.rag.option_fields import option_model, spelt_by
from midlens.rag.options import AnswerOptions

if TYPE_CHECKING:
    # torch loads with these, so they are imported where a call needs them: `from llama_index.llms.midlens import
    # MidlensLLM` stays as light as LlamaIndex's own integrations (llama_index.core and no torch).
    from midlens.generators.answering.citations import MeasuredCitations
    from midlens.generators.answering.generator import GenerationStream, Generator
    from midlens.generators.models.prompt import StackedPrompt
    from midlens.rag.answering import Answering
    from midlens.rag.llamaindex.remote import Served
    from midlens.rag.pipeline import AnswerStream, Pipeline
    from midlens.rag.remote import MidlensClient


def _chunks(stream: GenerationStream | AnswerStream) -> CompletionResponseGen:
    """Token deltas and, as each answer sentence ends, a chunk with no delta whose additional_kwargs["citation"]
    holds its Citation; then a last chunk (its delta may be empty) that carries the evidence in additional_kwargs."""
    from midlens.generators.answering.citations import Citation

    # Deltas track the stripped text so that ''.join(deltas) == the non-streaming answer exactly.
    raw, shown = "", ""
    for piece in stream.events():
        if isinstance(piece, Citation):  # its span indexes the stripped text, all of which is yielded by now
            yield CompletionResponse(text=shown, delta="", additional_kwargs={"citation": piece})
            continue
        raw += piece
        text = raw.strip()
        if len(text) > len(shown) and text.startswith(shown):
            yield CompletionResponse(text=text, delta=text[len(shown) :])
            shown = text
    answer = stream.answer
    yield _completion(answer, delta=answer.text[len(shown) :] if answer.text.startswith(shown) else "")


def _marked(chunks: CompletionResponseGen) -> CompletionResponseGen:
    """`_chunks` for a prompt that asks for "[N]" citations in the text (what `_completion(..., marked=True)` answers
    it with), the markers in the text: ''.join(deltas) is the non-streamed reply. A marker goes before its sentence's
    closing punctuation and is known once the next sentence has begun (its citation), so each sentence's text is
    held until then and goes out with its marker, in one chunk before its citation's; the last with the final chunk.
    A chunk's `text` is the marked text so far; a citation's span still indexes the answer's own text."""
    from midlens.rag.pipeline import marked_text

    cited, shown = [], ""
    for chunk in chunks:
        if "answer" in chunk.additional_kwargs:
            final = _completion(chunk.additional_kwargs["answer"], marked=True)
            follows = final.text.startswith(shown)
            if not follows:  # the streamed citations are the final ones (SentenceCiter): not expected
                logger.warning("MidlensLLM: the streamed citation markers differ from the finished answer's")
            final.delta = final.text[len(shown) :] if follows else ""
            yield final
            return
        if "citation" not in chunk.additional_kwargs:
            continue  # held: where its sentence's marker goes is not known yet
        cited.append(chunk.additional_kwargs["citation"])
        marked = marked_text(chunk.text, cited)
        upto = marked.text[: marked.spans[-1][1]]
        if len(upto) > len(shown):
            yield CompletionResponse(text=upto, delta=upto[len(shown) :])
        shown = upto
        yield CompletionResponse(text=shown, delta="", additional_kwargs=chunk.additional_kwargs)


class Request(NamedTuple):
    """What a completion call asks: the question, the passages, the generation options, whether the template asks
    for "[N]" citations in the answer's text (LlamaIndex's CitationQueryEngine), and whether it is a chat engine's
    condense prompt, whose text (`question`) the model completes as it is: a rewrite, no passages, no markers."""

    question: str
    passages: list[Passage]
    options: AnswerOptions
    marked: bool = False
    rewrite: bool = False


# What completes a condense prompt (`MidlensLLM._rewrite`): the model without an answering method.
PLAIN_METHOD = "baseline"


# MidlensLLM's fields that are AnswerOptions' (same names, defaults, bounds and help: rag/option_fields.py writes
# them), and what one call may change besides: a call's restacking may take several rounds, the field's takes one;
# `verify`, which MidlensQueryEngine asks of a call so the answer is verified before abstaining reads its support.
LLM_OPTIONS = spelt_by("llm")
CALL_OPTIONS = frozenset(LLM_OPTIONS) | {"restack_rounds", "verify"}
LLMOptions = option_model(
    "LLMOptions", "llm", base=BaseModel, unstreamed_note="A stream carries the support; it does not withhold."
)


class MidlensLLM(GeneratorBacked, LLMOptions, CustomLLM):
    """A midlens generator as a LlamaIndex LLM.

    `complete(question, passages=[nodes...])` stacks the passages into the lost-in-the-middle prompt and
    returns the answer with per-passage evidence in `additional_kwargs["evidence"]` (and the full
    `Answer` in `additional_kwargs["answer"]`). Without `passages`, a prompt formatted from one of LlamaIndex's
    default QA / refine templates (what `index.as_query_engine(llm=...)` sends) is read back into its query and
    context chunks, which are answered the same way, one passage per node (`read_stock_prompts`); any other
    prompt is the question of a stacked prompt with no documents. Passages are answered by `pipeline`, the same
    Pipeline.answer the CLI and the demo use. `complete(..., passages=nodes, restack="mudaf")` (or a
    generators.answering.restack.Restack) restacks them by that method's evidence first (what MidlensQueryEngine's
    `restack` passes); the evidence rows stay in the order the nodes were given. Without a `restack` in the call the
    LLM's `restack` field decides: "measured" (the default) restacks where that was measured to help its model and
    method (core.defaults.MEASURED_RESTACKS; none passes out of domain today), None never does.

    A chat engine's condense prompt (condense_plus_context's, condense_question's: the history and a follow-up to
    restate as a standalone question) is completed as written, in the model's chat template, by the model without
    its answering method, the history's "[N]" markers left out: its reply is the engine's retrieval query, so it
    gets no passages and no markers.

    Every chat reply's message carries the answer's support (and evidence, model, method, anything withheld) in its
    `additional_kwargs`, JSON-ready: LlamaIndex keeps the message (SimpleChatEngine's history, an agent's memory)
    and drops the response around it. The stock context chat engines build their reply from its text alone; there
    the support is on the LLM's completion (`additional_kwargs["support"]`, in LlamaIndex's LLM events).

    A prompt that asks for "[N]" citations in the answer's text (LlamaIndex's CitationQueryEngine and its context
    chat engines' templates) gets the attention citations as markers there, streamed or not. A marker goes before
    its sentence's closing punctuation and is known once the next sentence has begun, so a stream of such a reply
    sends each sentence whole, with its markers, then (the last one at the end): its deltas join into the
    non-streamed reply.
    """

    base_url: str | None = Field(
        default=None, description="A `midlens serve` server that answers instead of a model loaded in this process."
    )
    cite_evidence: str | None = Field(
        default=None,
        description="The method whose evidence of the prompt each answer's citations blend in (one more prefill per "
        "answer; e.g. mudaf, which raised the default model's citation F1): None, the answering pass's own.",
    )

    read_stock_prompts: bool = Field(
        default=True,
        description="Answer LlamaIndex's default text-QA / tree-summarize / refine prompts through the midlens "
        "prompt, their context chunks stacked as passages (False: the formatted template is the question).",
    )

    @model_validator(mode="after")
    def _consistent_options(self) -> MidlensLLM:
        _ = self.answer_options  # a misspelt scorer or a contradiction fails when the LLM is made, not at first use
        return self

    @property
    def answer_options(self) -> AnswerOptions:
        """The fields as the AnswerOptions every call starts from (a call's keywords change some of them)."""
        return AnswerOptions(**{name: getattr(self, name) for name in LLM_OPTIONS})

    @classmethod
    def _citations(cls, fields: dict[str, Any]) -> MeasuredCitations:
        from midlens.generators.answering.citations import MeasuredCitations

        # Checked in this field's name, not as the library's evidence_from it becomes.
        return MeasuredCitations(check_cite_evidence(fields.get("cite_evidence")))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("base_url") is not None and type(self) is MidlensLLM:
            raise InvalidArgumentError(
                f"MidlensLLM(base_url={kwargs['base_url']!r}) would answer through a server: build that one with "
                "MidlensLLM.from_server(base_url, ...), which checks the server and returns a RemoteMidlensLLM."
            )
        # The answering options are checked (by AnswerOptions, in their field names) before a model loads.
        AnswerOptions(**{name: kwargs[name] for name in LLM_OPTIONS if name in kwargs})
        super().__init__(*args, **kwargs)

    @classmethod
    def from_server(cls, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> RemoteMidlensLLM:
        """A MidlensLLM whose calls a `midlens serve` server at `base_url` answers (RemoteMidlensLLM: the same
        LlamaIndex class and calls; no model loaded here). `kwargs`: RemoteMidlensLLM's (model, method, timeout,
        retries, api_key) and this class's answering fields (max_new_tokens, temperature, restack, ...)."""
        return RemoteMidlensLLM(base_url=base_url, **kwargs)

    def _on_generator(self) -> None:
        note_llm_model(self.generator.loaded)

    @classmethod
    def from_generator(cls, generator: Generator, **kwargs: Any) -> MidlensLLM:
        """Wrap an existing Generator (shares its loaded model, method and evidence settings). It is the LLM's
        generator: none is built (building one would load the method's parts again, an artefact re-hashed)."""
        # The field describes the generator's citations; they are its own (set on the Generator), not this call's.
        kwargs["cite_evidence"] = getattr(generator.citations, "evidence_from", None)
        return cls(generator, method=generator.method.spec(), evidence=generator.evidence_config, **kwargs)

    @classmethod
    def class_name(cls) -> str:
        return "MidlensLLM"

    @property
    def pipeline(self) -> Pipeline:
        """The Pipeline that answers this LLM's passages with its options as they are now; retrieval stays with the
        caller (MidlensQueryEngine's LlamaIndex retriever). Cheap to make per call: a restack scorer's generator is
        built once per answering generator (`Generator.scorer`)."""
        return self._pipeline(self.answer_options)

    def _pipeline(self, options: AnswerOptions) -> Pipeline:
        from midlens.rag.pipeline import Pipeline  # here, not at the top: it loads torch

        return Pipeline(None, self.generator, options)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.generator.context_window,
            num_output=self.max_new_tokens,
            is_chat_model=False,
            model_name=f"{self.model}/{self.method}",
        )

    def _options(self, kwargs: dict[str, Any]) -> tuple[list | None, AnswerOptions]:
        """A call's passages, and its options: the fields, changed by the call's keywords."""
        passages = kwargs.pop("passages", None)
        unknown = set(kwargs) - CALL_OPTIONS
        if unknown:
            raise TypeError(
                f"MidlensLLM got unexpected option(s) {sorted(unknown)}; "
                f"valid: passages, {', '.join(sorted(CALL_OPTIONS))}."
            )
        return passages, self.answer_options.replace(**kwargs)

    def _request(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Request:
        """What a completion call asks (`Request`)."""
        passages, options = self._options(kwargs)
        question = prompt if formatted else self.completion_to_prompt(prompt)
        if passages is None and self.read_stock_prompts:
            condense = read_condense_prompt(question)
            if condense is not None:
                logger.debug("MidlensLLM: LlamaIndex %s prompt completed as a rewrite", condense.template)
                return Request(condense.prompt, [], options, rewrite=True)
        stock = self._stock(question) if passages is None else None
        if stock is not None:
            return Request(stock.question, stock.passages, options, stock.cites_in_text)
        return Request(question, [to_passage(p) for p in passages or []], options)

    def _stock(self, prompt: str) -> StockRequest | None:
        if not self.read_stock_prompts:
            return None
        stock = read_stock_prompt(prompt)
        if stock is not None:
            logger.debug("MidlensLLM: LlamaIndex %s prompt read as %d passages", stock.template, len(stock.passages))
        return stock

    def _stock_chat(self, messages: Sequence[ChatMessage]) -> StockRequest | None:
        """A chat QA template (LlamaIndex's system turn, if any, then the templated user turn) read back."""
        *before, last = messages
        if last.role != MessageRole.USER or any(
            m.role != MessageRole.SYSTEM or (m.content not in STOCK_SYSTEM_PROMPTS and m.content != self.system_prompt)
            for m in before
        ):
            return None
        return self._stock(last.content or "")

    def _prepare_chat(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[Answering, StackedPrompt, AnswerOptions, str]:
        """The answer path the chat goes through (rag.answering, as `complete`'s Pipeline), its prompt, options and
        the form of its reply ("text"; "marked": with [N] markers, as LlamaIndex's citation template asks;
        "blocks": CitationBlocks for CitableBlocks): a chat's CitableBlocks, or a QA template's passages, stacked as
        `complete` stacks them (restacked as the LLM's `restack` says), any other conversation in the model's chat
        template."""
        passages, options = self._options(kwargs)
        if passages:
            raise TypeError("chat() takes no passages: use complete(question, passages=[...]) or MidlensQueryEngine.")
        citable = citable_request(messages)
        if citable is not None:
            pipeline = self._pipeline(options)
            return pipeline.answering, pipeline.prompt(*citable), options, "blocks"
        stock = self._stock_chat(messages) if messages else None
        if stock is not None:
            pipeline = self._pipeline(options)
            prompt = pipeline.prompt(stock.question, stock.passages)
            return pipeline.answering, prompt, options, "marked" if stock.cites_in_text else "text"
        turns = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        return (*self._conversation(turns, options), "text")

    def _conversation(
        self, turns: list[dict[str, str]], options: AnswerOptions, generator: Generator | None = None
    ) -> tuple[Answering, StackedPrompt, AnswerOptions]:
        """A conversation in the model's chat template, the answer path (`generator`'s, else the LLM's) and the
        options it is answered with."""
        from midlens.generators.models.prompt import chat_prompt
        from midlens.rag.pipeline import Pipeline

        generator = generator or self.generator
        window = generator.context_window - options.max_new_tokens
        # A conversation has no passages: none to restack, to calibrate the evidence against, or whose support an
        # answer could be withheld for.
        plain = options.replace(calibrate=False, restack=None, restack_rounds=1, abstain=False, abstain_below=None)
        answering = Pipeline(None, generator, plain).answering
        return answering, chat_prompt(generator.tokenizer, turns, window), plain

    def _rewrite(self, request: Request) -> tuple[Answering, StackedPrompt, AnswerOptions]:
        """A condense prompt as the user turn of a conversation with the plain model: an answering method is
        chosen (or trained, as the fine-tune's short answers are) to answer over passages, and a rewrite is none.
        Run by the fine-tune, "When did it open?" became "1998", the retrieval query."""
        from midlens.generators.methods.registry import method_config

        plain = self.generator.scorer(method_config(PLAIN_METHOD))
        return self._conversation([{"role": "user", "content": request.question}], request.options, plain)

    def _complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._request(prompt, formatted, kwargs)
        if request.rewrite:
            answering, stacked, plain = self._rewrite(request)
            (answer,) = answering.answer([stacked], plain)
            return _completion(answer)
        answer = self._pipeline(request.options).answer(request.question, request.passages)
        return _completion(answer, marked=request.marked)

    def _stream(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        # Prompt errors (empty question, too long) raise here, at call time, not on the first next().
        request = self._request(prompt, formatted, kwargs)
        if request.rewrite:
            answering, stacked, plain = self._rewrite(request)
            return _chunks(answering.stream(stacked, plain))
        chunks = _chunks(self._pipeline(request.options).answer_stream(request.question, request.passages))
        return _marked(chunks) if request.marked else chunks

    # Chat goes through the model's own chat template, not the RAG prompt: chat engines and agents that use
    # this class as Settings.llm send whole conversations (system turns included).
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        answering, prompt, options, form = self._prepare_chat(messages, kwargs)
        (answer,) = answering.answer([prompt], options)
        response = _as_chat(_completion(answer, marked=form == "marked"))
        if form == "blocks":
            kept = response.message.additional_kwargs
            response.message = ChatMessage(
                role=MessageRole.ASSISTANT, blocks=answer_blocks(answer), additional_kwargs=kept
            )
        return response

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        answering, prompt, options, form = self._prepare_chat(messages, kwargs)
        stream = answering.stream(prompt, options)
        if form == "blocks":  # each sentence's CitationBlocks as the next sentence begins, as the Python API streams
            passages = prompt.passages
            return (
                _citation_chunk(chunk, passages) if "citation" in chunk.additional_kwargs else _as_chat(chunk)
                for chunk in _chunks(stream)
            )
        chunks = _marked(_chunks(stream)) if form == "marked" else _chunks(stream)
        # A generator, not a map: LlamaIndex's callback tells a stream from a response by that type.
        return (_as_chat(chunk) for chunk in chunks)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self.chat, messages, **kwargs)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._complete(prompt, formatted, **kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Token deltas; the last chunk (delta may be empty) carries the evidence in additional_kwargs."""
        return self._stream(prompt, formatted, **kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        # Generation is CPU/GPU-bound: run it in a worker thread so the event loop stays responsive.
        return await asyncio.to_thread(self._complete, prompt, formatted, **kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return _drain_in_thread(self._stream(prompt, formatted, **kwargs))


class RemoteMidlensLLM(MidlensLLM):
    """A MidlensLLM whose calls go to a `midlens serve` server: the LlamaIndex surface is MidlensLLM's (options,
    stock prompts read back, callbacks, async forms); the requests and replies are `Served`'s
    (rag/llamaindex/remote.py)."""

    _served: Served = PrivateAttr()

    def __init__(
        self,
        model: str | None = None,
        base_url: str = "http://127.0.0.1:8000",
        method: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`model`: left out, or the served model's name; `method`: a spec run on the server's weights (default: the
        server's); `api_key`: the server's key (default $MIDLENS_API_KEY); the other fields are MidlensLLM's
        (max_new_tokens, temperature, truncate, prompt_style, ...)."""
        for local in ("evidence", "device", "dtype", "method_options", "cite_evidence"):
            if kwargs.get(local):
                raise InvalidArgumentError(f"{local}= is the server's to choose: set it on `midlens serve`.")
            kwargs.pop(local, None)
        from midlens.rag.remote import connect  # httpx: only a LLM answered by a server needs it

        client, spec = connect(base_url, timeout=timeout, retries=retries, api_key=api_key)
        if model is not None and model != spec.model:
            raise InvalidArgumentError(f"model={model!r}: the server at {base_url} runs {spec.model!r}.")
        # Past GeneratorBacked, whose constructor loads a model: the fields describe the server's.
        CustomLLM.__init__(
            self,
            model=spec.model,
            method=method or spec.method_spec,
            method_options={},
            device=spec.device,
            dtype=spec.dtype,
            base_url=base_url,
            cite_evidence=spec.cite_evidence,
            **kwargs,
        )
        from midlens.rag.llamaindex.remote import Served

        self._served = Served(client, spec)

    @classmethod
    def class_name(cls) -> str:
        return "MidlensLLM"

    @property
    def client(self) -> MidlensClient:
        return self._served.client

    @property
    def pipeline(self):
        raise InvalidArgumentError("this MidlensLLM answers through a server: it has no local Pipeline.")

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._served.spec.context_window,
            num_output=self.max_new_tokens,
            is_chat_model=False,
            model_name=f"{self.model}/{self.method}",
        )

    # A template that asks for "[N]" in the text gets the markers here, from the server's citations, as a local
    # model's answer does: the server answers the question and passages read back from it, not the template.
    def _complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._request(prompt, formatted, kwargs)
        if request.rewrite:  # the served model's chat template and no answering method, as a local model's rewrite
            turns = [{"role": "user", "content": request.question}]
            return _as_completion(self._served.chat(PLAIN_METHOD, turns, request.options.replace(calibrate=False)))
        return self._served.complete(
            self.method, request.question, request.passages, request.options, marked=request.marked
        )

    def _stream(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        request = self._request(prompt, formatted, kwargs)
        if request.rewrite:
            turns = [{"role": "user", "content": request.question}]
            options = request.options.replace(calibrate=False)
            return self._served.stream(PLAIN_METHOD, turns, None, options, request.question)
        return self._served_stream(request.question, request.passages, request.options, request.marked)

    def _served_stream(
        self, question: str, passages: list[Passage], options: AnswerOptions, marked: bool
    ) -> CompletionResponseGen:
        """The server's stream of the answer to `question` over `passages`, with "[N]" markers when `marked`."""
        chunks = self._served.stream(self.method, [{"role": "user", "content": question}], passages, options, question)
        return _marked(chunks) if marked else chunks

    def _chat_options(self, kwargs: dict[str, Any]) -> AnswerOptions:
        passages, options = self._options(kwargs)
        if passages:
            raise TypeError("chat() takes no passages: use complete(question, passages=[...]) or MidlensQueryEngine.")
        return options

    def _chat_request(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> tuple[list[dict], AnswerOptions]:
        turns = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        return turns, self._chat_options(kwargs).replace(calibrate=False)

    # A stock QA chat template (LlamaIndex's context chat engines) is read back into its question and passages and
    # answered as `complete` answers them, markers included, as a local MidlensLLM's chat does; any other
    # conversation goes to the server's chat template.
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        stock = self._stock_chat(messages) if messages else None
        if stock is not None:
            options = self._chat_options(kwargs)
            return _as_chat(
                self._served.complete(self.method, stock.question, stock.passages, options, stock.cites_in_text)
            )
        turns, options = self._chat_request(messages, kwargs)
        return self._served.chat(self.method, turns, options)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        stock = self._stock_chat(messages) if messages else None
        if stock is not None:
            options = self._chat_options(kwargs)
            chunks = self._served_stream(stock.question, stock.passages, options, stock.cites_in_text)
            return (_as_chat(c) for c in chunks)
        turns, options = self._chat_request(messages, kwargs)
        return self._served.stream_chat(self.method, turns, options)


def _citation_chunk(chunk: CompletionResponse, passages: list[Passage]) -> ChatResponse:
    """A streamed sentence's citation as a chat chunk of CitationBlocks (no text delta)."""
    blocks = citation_blocks(chunk.additional_kwargs["citation"], passages)
    response = _as_chat(chunk)
    response.message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
    return response
