"""What the LlamaIndex classes share: nodes to passages, the generator they wrap, evidence as node metadata,
answers as LlamaIndex responses (from a local model or a server), and streaming a generator from a thread."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse, MessageRole
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore

from midlens.core.defaults import DEFAULT_MODEL
from midlens.core.passage import Passage

if TYPE_CHECKING:  # torch loads with these: imported where a model is built, so that importing an LLM class is light
    from midlens.generators.answering.answer import Answer
    from midlens.generators.answering.generator import Generator
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.loading import LoadedModel

logger = logging.getLogger(__name__)
# Models the MidlensLLMs of this process use, latest last: an AttentionReranker given no model shares one. Weak
# references: a model no LLM (nor load_model's own cache) holds any more leaves memory instead of living here.
_LLM_MODELS: list[weakref.ref[LoadedModel]] = []
# Held while a deferred generator loads: two threads reranking at once load it once.
_DEFERRED_LOAD = threading.RLock()
dispatcher = get_dispatcher(__name__)

PassageLike = Passage | NodeWithScore | BaseNode | str
# Metadata keys this module writes onto nodes; kept out of the text LLMs and embedders see.
_RERANK_KEYS = ("rerank_pass", "rerank_passes")


def llm_models() -> list[LoadedModel]:
    """The models MidlensLLMs use that are still in memory, latest last; references to gone ones are dropped."""
    alive = [m for m in (ref() for ref in _LLM_MODELS) if m is not None]
    _LLM_MODELS[:] = [weakref.ref(m) for m in alive]
    return alive


def note_llm_model(loaded: LoadedModel) -> None:
    """Record that a MidlensLLM answers with `loaded` (once per model; the first LLM on it sets its place)."""
    if all(m is not loaded for m in llm_models()):
        _LLM_MODELS.append(weakref.ref(loaded))


class GeneratorBacked(BaseModel):
    """The fields and constructor MidlensLLM and AttentionReranker share: a midlens Generator built from a model,
    a method spec and evidence settings, described by what it resolved to (the model's name, the device and dtype
    it loaded on). Mixed in before the LlamaIndex base class, whose fields come first.

    `model=None` defers the choice to first use (`_default_model`): a reranker built before the LLM it should
    share a model with must not load one of its own in the meantime."""

    model: str = Field(default=DEFAULT_MODEL, description="Registry name (e.g. smollm2-135m) or model folder.")
    method: str | None = Field(
        default=None,
        description="Method spec: a registry name or NAME(option=value, ...). None: the model's measured default "
        "(answering: core.defaults.ANSWER_METHODS; AttentionReranker: core.defaults.RERANKERS), set once the model "
        "is known.",
    )
    method_options: dict[str, Any] = Field(default_factory=dict, description="Options of the method.")
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N (auto: CUDA when present).")
    dtype: str = Field(default="auto", description="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA).")
    _generator: Generator | None = PrivateAttr(default=None)
    _evidence: EvidenceConfig | None = PrivateAttr(default=None)

    def __init__(
        self,
        model: str | LoadedModel | Generator | None = DEFAULT_MODEL,
        method: str | None = None,
        method_options: dict[str, Any] | None = None,
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        **kwargs: Any,
    ) -> None:
        from midlens.generators.answering.generator import Generator

        generator = None
        if isinstance(model, Generator):  # used as it is (`from_generator`): the caller's settings describe it
            generator = model
            method = method or model.method.spec()
        elif model is not None:
            method = method or self._default_method(model)
            generator = Generator(
                model,
                method=method,
                evidence=evidence,
                device=device,
                dtype=dtype,
                citations=self._citations(kwargs),
                **(method_options or {}),
            )
        elif method is not None:  # the model is resolved at first use; a bad method spec still fails now
            from midlens.generators.methods.registry import method_config

            method_config(method, method_options or {})
        super().__init__(
            model=None if generator is None else generator.loaded.name,
            method=method,
            method_options=dict(method_options or {}),
            device=device,
            dtype=dtype,
            **kwargs,
        )
        self._evidence = evidence
        if generator is not None:
            self._set_generator(generator)

    def _set_generator(self, generator: Generator) -> None:
        self._generator = generator
        self.model = generator.loaded.name
        self.device = str(generator.device)
        self.dtype = str(generator.loaded.dtype).removeprefix("torch.")
        self._on_generator()

    def _build_generator(self, model: str | LoadedModel) -> Generator:
        """A Generator on `model` with this object's method (its default for `model` when none was named; the field
        then keeps the one chosen) and evidence settings."""
        from midlens.generators.answering.generator import Generator

        if self.method is None:
            self.method = self._default_method(model)
        return Generator(
            model,
            method=self.method,
            evidence=self._evidence,
            device=self.device,
            dtype=self.dtype,
            citations=self._citations(dict(self)),
            **self.method_options,
        )

    @classmethod
    def _citations(cls, fields: dict[str, Any]) -> Any:
        """How the generator cites, from the object's fields (in __init__, before pydantic has set them: the
        keyword arguments): the rule measured for its model and method."""
        return "measured"

    def _default_model(self) -> str | LoadedModel:
        """The model a deferred generator loads at first use."""
        return DEFAULT_MODEL

    @classmethod
    def _default_method(cls, model: str | LoadedModel) -> str:
        """The method run on `model` where none is named: the answering default measured for it."""
        from midlens.generators.models.packaged_models import default_method

        return default_method(model)

    def _on_generator(self) -> None:
        """What a class does once its generator is loaded (the LLM shares its model, the reranker checks whether
        it does)."""

    @property
    def generator(self) -> Generator:
        if self._generator is None:
            with _DEFERRED_LOAD:
                if self._generator is None:
                    self._set_generator(self._build_generator(self._default_model()))
        assert self._generator is not None
        return self._generator


def to_passage(item: PassageLike) -> Passage:
    """A LlamaIndex node (or a Passage, or plain text) -> the Passage the prompt builder stacks.

    The title is the node's `title` metadata, else its file name without suffix; the text is the node's
    content without metadata (metadata would spend the context window on key: value lines).
    """
    if isinstance(item, Passage):
        return item
    if isinstance(item, str):
        return Passage(text=item)
    if isinstance(item, NodeWithScore):
        node, score = item.node, item.score
    elif isinstance(item, BaseNode):
        node, score = item, None
    else:
        raise TypeError(
            f"cannot stack a {type(item).__name__} as a passage: pass NodeWithScore, a LlamaIndex node, "
            "a midlens Passage or a string."
        )
    meta = node.metadata or {}
    title = meta.get("title") or (Path(str(meta["file_name"])).stem if meta.get("file_name") else "")
    return Passage(
        text=node.get_content(metadata_mode=MetadataMode.NONE),
        title=str(title),
        id=node.node_id,
        score=None if score is None else float(score),
    )


def node_passages(nodes: Sequence[PassageLike]) -> list[Passage]:
    """The passages a response is checked over, from its source nodes (or contexts given as text), in their order:
    what CheckedQueryEngine and MidlensEvaluator both stack. A passage's title is part of the prompt, so a verdict
    is the same for the same response and nodes only when both name them alike (`to_passage`)."""
    return [to_passage(node) for node in nodes]


def evidence_rows(answer: Answer) -> list[dict]:
    """Per-passage breakdown, JSON-ready, in prompt order: each passage's row of the answer's wire form
    (generators.answering.answer_wire), less `score`, which a response's source nodes carry as their score."""
    from midlens.generators.answering.answer_wire import passage_to_wire

    return [_llama_row(passage_to_wire(pe)) for pe in answer.passages]


def _llama_row(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "score"}


# The fields of an answer's wire form a response's additional_kwargs carry beside the Answer and its evidence rows.
RESPONSE_KEYS = ("model", "method", "prompt_tokens", "generated_tokens", "timings", "dropped", "support", "withheld")


def _response_kwargs(answer: Answer) -> dict[str, Any]:
    """The Answer, its evidence rows and, from its wire form (the one a server sends: a response reads the same from
    a local model and from a server), the model, method, token counts, timings, dropped ids, whether to trust the
    answer (generators.answering.support, the first thing a response's reader should see) and any withheld text."""
    from midlens.generators.answering.answer_wire import answer_to_wire

    wire = answer_to_wire(answer)
    return {
        "answer": answer,
        "evidence": [_llama_row(row) for row in wire["passages"]],
        **{key: wire[key] for key in RESPONSE_KEYS},
    }


def _completion(answer: Answer, delta: str | None = None, marked: bool = False) -> CompletionResponse:
    """An Answer as LlamaIndex's completion (whether a local model or a server gave it): the text, and the evidence
    in additional_kwargs. `marked`: the text with "[n]" after each cited sentence (the passages' prompt positions),
    for a prompt that asks for citations in the text."""
    from midlens.rag.pipeline import marked_answer

    text = marked_answer(answer).text if marked else answer.text
    return CompletionResponse(text=text, delta=delta, additional_kwargs=_response_kwargs(answer), raw=answer.to_dict())


# What a chat reply's message carries of its answer, the support first. The message is what LlamaIndex keeps of a
# reply (SimpleChatEngine's history, an agent's memory); the response's own additional_kwargs, which hold the Answer
# itself, are dropped with it.
MESSAGE_KEYS = ("support", "withheld", "evidence", "model", "method")


def _as_chat(completion: CompletionResponse) -> ChatResponse:
    done = "answer" in completion.additional_kwargs  # the last chunk of a stream, or a whole reply
    # As JSON gives them back: a chat memory stores its messages as JSON, and a message must read the same after.
    kept = json.loads(json.dumps({key: completion.additional_kwargs[key] for key in MESSAGE_KEYS})) if done else {}
    return ChatResponse(
        message=ChatMessage(role=MessageRole.ASSISTANT, content=completion.text, additional_kwargs=kept),
        delta=completion.delta,
        additional_kwargs=completion.additional_kwargs,
        raw=completion.raw,
    )


def _as_completion(chat: ChatResponse) -> CompletionResponse:
    return CompletionResponse(
        text=chat.message.content or "", delta=chat.delta, additional_kwargs=chat.additional_kwargs, raw=chat.raw
    )


_DONE = object()


def _drain_in_thread(sync: Iterator[Any]):
    """Run a sync generator to the end in one dedicated thread, handing items to the event loop.

    One thread for the whole generator matters: the generator holds the model's RLock between yields, and
    an RLock must be released by the thread that took it (asyncio.to_thread(next, ...) hops threads).
    """

    async def gen():
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def work() -> None:
            try:
                for item in sync:
                    loop.call_soon_threadsafe(queue.put_nowait, item)
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)
            except BaseException as err:  # re-raised in the consumer
                loop.call_soon_threadsafe(queue.put_nowait, err)

        threading.Thread(target=work, name="midlens-stream", daemon=True).start()
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    return gen()
