"""LlamaIndex components over the midlens Generator (llama-index-core 0.14).

    MidlensLLM          a CustomLLM: complete / stream_complete / chat / acomplete; evidence in additional_kwargs
    AttentionReranker   a BaseNodePostprocessor: nodes scored by the attention the model gives them in one stacked pass
    MidlensQueryEngine  a CustomQueryEngine: retrieve -> stack -> generate; source_nodes carry evidence scores
    MidlensRetriever    a BaseRetriever over the repo's own retriever (dense, hybrid, +links)

Every class is a shell over `Generator.prompt` + `Generator.generate/stream/score`: prompting, evidence and
calibration have one implementation, the same one the CLI and the pipeline use.

    index = VectorStoreIndex(nodes, storage_context=..., embed_model=...)
    engine = MidlensQueryEngine.from_index(index, method="ms-poe")
    response = engine.query("Who directed Wings of Desire?")
    for source in response.source_nodes: print(source.score, response.metadata[source.node_id])
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from llama_index.core.base.base_retriever import BaseRetriever  # noqa: E402
from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.base.response.schema import (  # noqa: E402
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr  # noqa: E402
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload  # noqa: E402
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent  # noqa: E402
from llama_index.core.llms import CustomLLM  # noqa: E402
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.query_engine import CustomQueryEngine  # noqa: E402
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402

from midlens.core.errors import PromptTooLongError  # noqa: E402
from midlens.core.names import DEFAULT_MAX_NEW_TOKENS, DEFAULT_RETRIEVAL, DEFAULT_TOP_K  # noqa: E402
from midlens.generators.evidence import Answer, EvidenceConfig  # noqa: E402
from midlens.generators.generator import Generator  # noqa: E402
from midlens.generators.models import DEFAULT_MODEL, LoadedModel  # noqa: E402
from midlens.generators.prompt import Passage, StackedPrompt, chat_prompt, fit_windows  # noqa: E402

logger = logging.getLogger(__name__)
dispatcher = get_dispatcher(__name__)

GENERATE_OPTIONS = ("max_new_tokens", "temperature", "top_p", "seed", "calibrate")
PassageLike = Passage | NodeWithScore | BaseNode | str
# Metadata keys this module writes onto nodes; kept out of the text LLMs and embedders see.
_RERANK_KEYS = ("rerank_pass", "rerank_passes")


def _make_generator(
    model: str | LoadedModel,
    method: str,
    method_options: dict | None,
    evidence: EvidenceConfig | None,
    device: str = "auto",
    dtype: str = "auto",
) -> tuple[Generator, dict[str, Any]]:
    """The generator both classes wrap, and the pydantic fields that describe it (what it resolved to: the model's
    name, the device and dtype it loaded on)."""
    generator = Generator(model, method=method, evidence=evidence, device=device, dtype=dtype, **(method_options or {}))
    fields = {
        "model": generator.loaded.name,
        "method": method,
        "method_options": dict(method_options or {}),
        "device": str(generator.device),
        "dtype": str(generator.loaded.dtype).removeprefix("torch."),
    }
    return generator, fields


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


def evidence_rows(answer: Answer) -> list[dict]:
    """Per-passage breakdown, JSON-ready, in prompt order."""
    return [
        {
            "id": pe.passage.id,
            "title": pe.passage.title,
            "position": pe.position,
            "retrieval_score": pe.retrieval_score,
            "evidence": pe.evidence,
            "calibrated": pe.calibrated,
            "answer_attribution": pe.answer_attribution,
            "rank": pe.rank,
        }
        for pe in answer.passages
    ]


def _response_kwargs(answer: Answer) -> dict[str, Any]:
    return {
        "answer": answer,
        "evidence": evidence_rows(answer),
        "model": answer.model,
        "method": answer.method,
        "prompt_tokens": answer.prompt_tokens,
        "generated_tokens": answer.generated_tokens,
        "timings": answer.timings,
        "dropped": [p.id for p in answer.dropped],
    }


class MidlensLLM(CustomLLM):
    """A midlens generator as a LlamaIndex LLM.

    `complete(question, passages=[nodes...])` stacks the passages into the lost-in-the-middle prompt and
    returns the answer with per-passage evidence in `additional_kwargs["evidence"]` (and the full
    `Answer` in `additional_kwargs["answer"]`). Without `passages` the prompt is the question of a stacked
    prompt with no documents: a stock LlamaIndex synthesizer's context then reaches the model as plain text
    and gets no per-passage evidence (use MidlensQueryEngine for that).
    """

    model: str = Field(default=DEFAULT_MODEL, description="Registry name (e.g. smollm2-135m) or model folder.")
    method: str = Field(default="baseline", description="Method spec: a registry name or NAME(option=value, ...).")
    method_options: dict[str, Any] = Field(default_factory=dict, description="Options of the method.")
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N (auto: CUDA when present).")
    dtype: str = Field(default="auto", description="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA).")
    max_new_tokens: int = Field(default=DEFAULT_MAX_NEW_TOKENS, ge=0, description="Most tokens generated per call.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=0, description="Sampling seed (temperature > 0).")
    calibrate: bool = Field(default=True, description="Also compute calibrated evidence (content-free query).")
    truncate: Literal["error", "drop_last"] = Field(
        default="error", description="What to do when the passages do not fit the context window."
    )
    prompt_style: Literal["litm", "short"] = Field(
        default="litm", description="Instruction above the passages: Liu et al.'s, or 'short' for the bare answer."
    )
    _generator: Generator = PrivateAttr()

    def __init__(
        self,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str = "baseline",
        method_options: dict[str, Any] | None = None,
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        **kwargs: Any,
    ) -> None:
        generator, fields = _make_generator(model, method, method_options, evidence, device, dtype)
        super().__init__(**fields, **kwargs)
        self._generator = generator

    @classmethod
    def from_generator(cls, generator: Generator, **kwargs: Any) -> MidlensLLM:
        """Wrap an existing Generator (shares its loaded model, method and evidence settings)."""
        llm = cls(generator.loaded, method=generator.method.spec(), evidence=generator.evidence_config, **kwargs)
        llm._generator = generator
        return llm

    @classmethod
    def class_name(cls) -> str:
        return "MidlensLLM"

    @property
    def generator(self) -> Generator:
        return self._generator

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._generator.context_window,
            num_output=self.max_new_tokens,
            is_chat_model=False,
            model_name=f"{self.model}/{self.method}",
        )

    def _options(self, kwargs: dict[str, Any]) -> tuple[list | None, dict[str, Any]]:
        passages = kwargs.pop("passages", None)
        unknown = set(kwargs) - set(GENERATE_OPTIONS)
        if unknown:
            raise TypeError(
                f"MidlensLLM got unexpected option(s) {sorted(unknown)}; "
                f"valid: passages, {', '.join(GENERATE_OPTIONS)}."
            )
        options = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "calibrate": self.calibrate,
            **kwargs,
        }
        return passages, options

    def _prepare(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> tuple[StackedPrompt, dict[str, Any]]:
        passages, options = self._options(kwargs)
        question = prompt if formatted else self.completion_to_prompt(prompt)
        stacked = self._generator.prompt(
            question,
            [to_passage(p) for p in passages or []],
            max_new_tokens=options["max_new_tokens"],
            truncate=self.truncate,
            style=self.prompt_style,
        )
        if not stacked.passages:
            options["calibrate"] = False  # no passage to calibrate evidence for
        return stacked, options

    def _prepare_chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> tuple[StackedPrompt, dict]:
        passages, options = self._options(kwargs)
        if passages:
            raise TypeError("chat() takes no passages: use complete(question, passages=[...]) or MidlensQueryEngine.")
        turns = [{"role": m.role.value, "content": m.content or ""} for m in messages]
        window = self._generator.context_window - options["max_new_tokens"]
        options["calibrate"] = False
        return chat_prompt(self._generator.tokenizer, turns, window), options

    def _complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        stacked, options = self._prepare(prompt, formatted, kwargs)
        answer = self._generator.generate(stacked, **options)
        return CompletionResponse(text=answer.text, additional_kwargs=_response_kwargs(answer), raw=answer.to_dict())

    def _stream(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        # Prompt errors (empty question, too long) raise here, at call time, not on the first next().
        stacked, options = self._prepare(prompt, formatted, kwargs)
        return self._chunks(stacked, options)

    def _chunks(self, stacked: StackedPrompt, options: dict[str, Any]) -> CompletionResponseGen:
        stream = self._generator.stream(stacked, **options)

        def chunks() -> CompletionResponseGen:
            # Deltas track the stripped text so that ''.join(deltas) == the non-streaming answer exactly.
            raw, shown = "", ""
            for piece in stream:
                raw += piece
                text = raw.strip()
                if len(text) > len(shown) and text.startswith(shown):
                    yield CompletionResponse(text=text, delta=text[len(shown) :])
                    shown = text
            answer = stream.answer
            tail = answer.text[len(shown) :] if answer.text.startswith(shown) else ""
            yield CompletionResponse(
                text=answer.text, delta=tail, additional_kwargs=_response_kwargs(answer), raw=answer.to_dict()
            )

        return chunks()

    # Chat goes through the model's own chat template, not the RAG prompt: chat engines and agents that use
    # this class as Settings.llm send whole conversations (system turns included).
    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        stacked, options = self._prepare_chat(messages, kwargs)
        answer = self._generator.generate(stacked, **options)
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=answer.text),
            additional_kwargs=_response_kwargs(answer),
            raw=answer.to_dict(),
        )

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        stacked, options = self._prepare_chat(messages, kwargs)
        chunks = self._chunks(stacked, options)

        def gen() -> ChatResponseGen:
            for chunk in chunks:
                message = ChatMessage(role=MessageRole.ASSISTANT, content=chunk.text)
                yield ChatResponse(
                    message=message, delta=chunk.delta, additional_kwargs=chunk.additional_kwargs, raw=chunk.raw
                )

        return gen()

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
        sync = self._stream(prompt, formatted, **kwargs)
        return _drain_in_thread(sync)


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


class AttentionReranker(BaseNodePostprocessor):
    """Rerank retrieved nodes by the attention a midlens generator gives them in one stacked forward pass.

    All nodes are stacked (in the given order) under the query; the score of a node is its calibrated
    evidence (attention mass minus that of a content-free query; `score_by="evidence"` for the raw mass).
    No tokens are decoded. Nodes that do not fit one window (or `max_tokens_per_pass`) are split into
    several passes of consecutive nodes; every node is scored, and each then carries `rerank_pass` /
    `rerank_passes` in its metadata, because scores from passes of different sizes are less comparable.
    A single node longer than the window is refused with PromptTooLongError.
    """

    top_n: int = Field(default=2, ge=1, description="Number of nodes to return sorted by score.")
    model: str = Field(default=DEFAULT_MODEL, description="Registry name or folder of the scoring model.")
    method: str = Field(default="baseline", description="Method spec: a registry name or NAME(option=value, ...).")
    method_options: dict[str, Any] = Field(default_factory=dict)
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N (auto: CUDA when present).")
    dtype: str = Field(default="auto", description="auto | float32 | bfloat16 | float16 (auto: bf16 on CUDA).")
    score_by: Literal["calibrated", "evidence"] = Field(default="calibrated", description="Which evidence to rank by.")
    keep_retrieval_score: bool = Field(default=False, description="Whether to keep the retrieval score in metadata.")
    max_tokens_per_pass: int | None = Field(
        default=None, ge=16, description="Cap on one stacked prompt (default: the model's context window)."
    )
    _generator: Generator = PrivateAttr()

    def __init__(
        self,
        top_n: int = 2,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str = "baseline",
        method_options: dict[str, Any] | None = None,
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        **kwargs: Any,
    ) -> None:
        generator, fields = _make_generator(model, method, method_options, evidence, device, dtype)
        super().__init__(top_n=top_n, **fields, **kwargs)
        self._generator = generator

    @classmethod
    def class_name(cls) -> str:
        return "AttentionReranker"

    @property
    def generator(self) -> Generator:
        return self._generator

    def _passes(self, query: str, passages: list[Passage]) -> list[StackedPrompt]:
        """Consecutive groups of passages, each stacked into the fullest prompt that fits (the prompt builder's
        own fitting, so a pass holds exactly what `truncate='drop_last'` would keep)."""
        window = self._generator.context_window
        limit = min(window, self.max_tokens_per_pass or window)
        prompts: list[StackedPrompt] = []
        try:
            for prompt in fit_windows(self._generator.tokenizer, passages, query, limit):
                prompts.append(prompt)
        except PromptTooLongError as err:
            if err.part != "passages":  # the query itself is too long: its own message says so
                raise
            first = passages[sum(len(p.passages) for p in prompts)]
            cap = "max_tokens_per_pass" if limit < window else "the context window"
            raise PromptTooLongError(
                f"node {first.id or '(no id)'} does not fit one reranking pass: stacked alone under the query "
                f"it takes {err.prompt_tokens} tokens, more than the {limit} allowed ({cap}). Split documents into "
                "smaller nodes (e.g. SentenceSplitter(chunk_size=...)) or raise max_tokens_per_pass.",
                prompt_tokens=err.prompt_tokens,
                window=limit,
                passages_that_fit=0,
                passages=len(passages),
            ) from None
        return prompts

    def _postprocess_nodes(
        self,
        nodes: list[NodeWithScore],
        query_bundle: QueryBundle | None = None,
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            # Same error as SentenceTransformerRerank, so callers that catch it keep working.
            raise ValueError("Missing query bundle in extra info.")
        if len(nodes) == 0:
            return []
        model_name = f"{self.model}/{self.method}"
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=self.top_n, model_name=model_name))
        with self.callback_manager.event(
            CBEventType.RERANKING,
            payload={
                EventPayload.NODES: nodes,
                EventPayload.MODEL_NAME: model_name,
                EventPayload.QUERY_STR: query_bundle.query_str,
                EventPayload.TOP_K: self.top_n,
            },
        ) as event:
            passages = [to_passage(n) for n in nodes]
            prompts = self._passes(query_bundle.query_str, passages)
            scores: list[float] = []
            for prompt in prompts:
                answer = self._generator.score(prompt, calibrate=self.score_by == "calibrated")
                scores += [pe.evidence if self.score_by == "evidence" else pe.score for pe in answer.passages]
            assert len(scores) == len(nodes)
            if len(prompts) > 1:
                logger.warning(
                    "AttentionReranker: %d nodes did not fit one pass; scored them in %d passes.",
                    len(nodes),
                    len(prompts),
                )
            index = 0
            for number, prompt in enumerate(prompts, start=1):
                for _ in prompt.passages:
                    node = nodes[index]
                    if self.keep_retrieval_score:
                        node.node.metadata["retrieval_score"] = node.score
                    if len(prompts) > 1:
                        node.node.metadata.update(rerank_pass=number, rerank_passes=len(prompts))
                        for keys in (node.node.excluded_llm_metadata_keys, node.node.excluded_embed_metadata_keys):
                            keys.extend(k for k in _RERANK_KEYS if k not in keys)
                    node.score = scores[index]
                    index += 1
            # Stable sort: ties keep the retrieval order.
            new_nodes = sorted(nodes, key=lambda n: -(n.score or 0.0))[: self.top_n]
            event.on_end(payload={EventPayload.NODES: new_nodes})
        dispatcher.event(ReRankEndEvent(nodes=new_nodes))
        return new_nodes


class MidlensRetriever(BaseRetriever):
    """The repo's retriever (dense: faiss + packaged MiniLM; hybrid: + BM25; +links: titles the top 2 name) as a
    LlamaIndex retriever."""

    def __init__(self, retriever: Any, similarity_top_k: int = DEFAULT_TOP_K, **kwargs: Any) -> None:
        if similarity_top_k < 1:
            raise ValueError(f"similarity_top_k={similarity_top_k} must be >= 1.")
        self._retriever = retriever
        self.similarity_top_k = similarity_top_k
        super().__init__(**kwargs)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | Path,
        index_dir: str | Path | None = None,
        similarity_top_k: int = DEFAULT_TOP_K,
        retrieval: str = DEFAULT_RETRIEVAL,
        **kwargs: Any,
    ) -> MidlensRetriever:
        """Build (or reuse) the index of a folder / .jsonl corpus, as `midlens ask --corpus` does."""
        from midlens.retrievers.build import build_retriever

        return cls(build_retriever(corpus, retrieval, index_dir=index_dir), similarity_top_k, **kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [
            NodeWithScore(
                node=TextNode(
                    id_=p.id or None,
                    text=p.text,
                    metadata={"title": p.title, **p.metadata},
                    excluded_embed_metadata_keys=list(p.metadata),
                    excluded_llm_metadata_keys=list(p.metadata),
                ),
                score=p.score,
            )
            for p in self._retriever.search(query_bundle.query_str, self.similarity_top_k)
        ]


class MidlensQueryEngine(CustomQueryEngine):
    """retrieve -> (postprocess) -> stack -> generate, with evidence-scored sources.

    `response.source_nodes` are the stacked nodes, strongest evidence first, `score` = calibrated evidence
    (raw when calibration is off); `response.metadata[node_id]` holds the breakdown (prompt position,
    retrieval score, evidence, calibrated, answer attribution, rank) and `response.metadata["midlens"]`
    the run (model, method, tokens, timings, dropped node ids). With `streaming=True` the query returns a
    StreamingResponse whose sources carry retrieval scores until the stream is consumed, evidence after.
    """

    retriever: BaseRetriever
    llm: MidlensLLM
    node_postprocessors: list[BaseNodePostprocessor] = Field(default_factory=list)
    streaming: bool = False

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: MidlensLLM | None = None,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str = "baseline",
        method_options: dict[str, Any] | None = None,
        evidence: EvidenceConfig | None = None,
        node_postprocessors: Sequence[BaseNodePostprocessor] = (),
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
        **llm_kwargs: Any,
    ) -> None:
        if llm is None:
            llm = MidlensLLM(model, method=method, method_options=method_options, evidence=evidence, **llm_kwargs)
        elif llm_kwargs or method_options or method != "baseline":
            raise ValueError("pass either llm=MidlensLLM(...) or model/method options, not both.")
        super().__init__(
            retriever=retriever,
            llm=llm,
            node_postprocessors=list(node_postprocessors),
            streaming=streaming,
            callback_manager=callback_manager or CallbackManager([]),
        )

    @classmethod
    def from_index(cls, index: Any, similarity_top_k: int = DEFAULT_TOP_K, **kwargs: Any) -> MidlensQueryEngine:
        """Over any LlamaIndex index (VectorStoreIndex on Faiss, Qdrant, ...): only its retriever is used."""
        return cls(retriever=index.as_retriever(similarity_top_k=similarity_top_k), **kwargs)

    def _postprocess(self, nodes: list[NodeWithScore], query_str: str) -> list[NodeWithScore]:
        bundle = QueryBundle(query_str)
        for postprocessor in self.node_postprocessors:
            nodes = postprocessor.postprocess_nodes(nodes, query_bundle=bundle)
        return nodes

    @staticmethod
    def _scored(nodes: list[NodeWithScore], answer: Answer) -> tuple[list[NodeWithScore], dict[str, Any]]:
        by_id = {n.node.node_id: n for n in nodes}
        sources, metadata = [], {}
        for row, pe in zip(evidence_rows(answer), answer.passages, strict=True):
            if row["id"] not in by_id:  # dropped by truncate="drop_last": listed in metadata["midlens"]
                continue
            sources.append((pe.rank, NodeWithScore(node=by_id[row["id"]].node, score=pe.score)))
            metadata[row["id"]] = row
        kwargs = _response_kwargs(answer)
        kwargs.pop("answer")
        kwargs.pop("evidence")
        metadata["midlens"] = {**kwargs, "evidence_config": answer.to_dict()["evidence_config"]}
        return [n for _, n in sorted(sources, key=lambda s: s[0])], metadata

    def _generate(self, query_str: str, nodes: list[NodeWithScore]) -> Response | StreamingResponse:
        if not nodes:
            return Response("Empty Response", source_nodes=[], metadata={})
        if not self.streaming:
            completion = self.llm.complete(query_str, passages=nodes)
            sources, metadata = self._scored(nodes, completion.additional_kwargs["answer"])
            return Response(completion.text, source_nodes=sources, metadata=metadata)
        chunks = self.llm.stream_complete(query_str, passages=nodes)
        response = StreamingResponse(response_gen=None, source_nodes=list(nodes), metadata={})

        def tokens() -> Iterator[str]:
            for chunk in chunks:
                if "answer" in chunk.additional_kwargs:
                    self._finish(response, nodes, chunk.additional_kwargs["answer"])
                if chunk.delta:
                    yield chunk.delta

        response.response_gen = tokens()
        return response

    def _finish(self, response: StreamingResponse | AsyncStreamingResponse, nodes, answer: Answer) -> None:
        sources, metadata = self._scored(nodes, answer)
        response.source_nodes[:] = sources
        response.metadata.clear()
        response.metadata.update(metadata)

    def custom_query(self, query_str: str) -> Response | StreamingResponse:
        nodes = self._postprocess(self.retriever.retrieve(query_str), query_str)
        return self._generate(query_str, nodes)

    async def acustom_query(self, query_str: str) -> Response | AsyncStreamingResponse:
        nodes = await self.retriever.aretrieve(query_str)
        bundle = QueryBundle(query_str)
        for postprocessor in self.node_postprocessors:
            nodes = await postprocessor.apostprocess_nodes(nodes, query_bundle=bundle)
        if not nodes:
            return Response("Empty Response", source_nodes=[], metadata={})
        if not self.streaming:
            completion = await self.llm.acomplete(query_str, passages=nodes)
            sources, metadata = self._scored(nodes, completion.additional_kwargs["answer"])
            return Response(completion.text, source_nodes=sources, metadata=metadata)
        chunks = await self.llm.astream_complete(query_str, passages=nodes)
        response = AsyncStreamingResponse(response_gen=None, source_nodes=list(nodes), metadata={})

        async def tokens():
            async for chunk in chunks:
                if "answer" in chunk.additional_kwargs:
                    self._finish(response, nodes, chunk.additional_kwargs["answer"])
                if chunk.delta:
                    yield chunk.delta

        response.response_gen = tokens()
        return response
