"""MidlensQueryEngine: a LlamaIndex CustomQueryEngine, retrieve -> Pipeline (stack, generate), sources with evidence."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from copy import copy
from typing import Any, ClassVar, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.base.response.schema import (
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.bridge.pydantic import BaseModel, Field
from llama_index.core.callbacks import CallbackManager
from llama_index.core.chat_engine import CondenseQuestionChatEngine
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle

from midlens.core.defaults import DEFAULT_TOP_K, is_measured_restack
from midlens.core.errors import InvalidArgumentError
from midlens.core.validation import check_top_k
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.answer_wire import answer_to_wire
from midlens.generators.answering.restack import Restack
from midlens.generators.attention.evidence import EvidenceConfig, PassageEvidence
from midlens.generators.models.loading import LoadedModel
from midlens.generators.models.packaged_models import DEFAULT_MODEL
from midlens.rag.llamaindex.citations import citation_rows, sentence_rows
from midlens.rag.llamaindex.common import (
    _response_kwargs,
    evidence_rows,
)
from midlens.rag.llamaindex.llm import MidlensLLM
from midlens.rag.llamaindex.reranker import AttentionReranker
from midlens.rag.option_fields import option_model
from midlens.rag.options import FIELDS, AnswerOptions
from midlens.rag.pipeline import marked_answer

# The engine's own answering fields: what the LLM leaves to it (`verify`, which needs the model here, and a restack of
# several rounds) and the `restack` that overrides the LLM's. Written from AnswerOptions' fields (default, help,
# bounds: rag/option_fields.py) as the LLM's are; the server's request spells all three, so its spelling less the
# others is the engine's. The keywords' defaults are the same fields' (`_DEFAULTS`).
ENGINE_OPTIONS = frozenset({"verify", "restack", "restack_rounds"})
EngineOptions = option_model("EngineOptions", "request", exclude=FIELDS - ENGINE_OPTIONS, base=BaseModel)
_DEFAULTS = AnswerOptions()


def _empty() -> Response:
    return Response("Empty Response", source_nodes=[], metadata={})


class MidlensQueryEngine(EngineOptions, CustomQueryEngine):
    """retrieve -> (postprocess) -> stack -> generate, with evidence-scored sources.

    Retrieval and postprocessing are LlamaIndex's (an AttentionReranker given no model of its own scores with the
    engine's model, `AttentionReranker.share_model`); stacking and generation are the `llm`'s Pipeline
    (`MidlensLLM.pipeline`, the one `midlens ask` answers with), reached through the LLM's complete calls so that
    LlamaIndex's LLM events and callbacks fire as for any other engine.

    `response.source_nodes` are the stacked nodes, strongest evidence first, `score` = calibrated evidence
    (raw when calibration is off); `response.metadata[node_id]` holds the breakdown (prompt position,
    retrieval score, evidence, calibrated, answer attribution, rank) and `response.metadata["midlens"]`
    the run (model, method, tokens, timings, dropped node ids) and the answer's citations: `citations`, one row per
    (answer sentence, cited node) with the node id, the cited sentence's characters in the node's text, the
    sentence's characters in the answer (`text`; `marked_text` is the answer with "[n]" markers), its attention
    share and, with `verify=True`, whether removing the node costs the sentence log-probability (`verified`,
    `logprob_drop`). A marker's number is the node's position in the prompt (`markers` maps it to the node id, and
    `metadata[node_id]["position"]` is the same number). With `streaming=True` the query returns a
    StreamingResponse whose sources carry retrieval scores until the stream is consumed and evidence after; each
    answer sentence's citation rows join `metadata["midlens"]["citations"]` while it streams, as soon as the next
    sentence has begun (`marked_chars` None until the answer ends, `streamed_sentences` counting the sentences cited
    so far; with `verify=True` only at the end, verified).
    `as_chat_engine()` wraps the engine in LlamaIndex's CondenseQuestionChatEngine. `restack="mudaf"` (a method
    spec, or a generators.answering.restack.Restack) scores the nodes with that method's evidence and stacks the
    strongest in the slots the model reads best before answering (`restack_rounds` scoring passes); positions, markers
    and metadata keep the order the nodes were retrieved in, and `metadata["midlens"]["restack"]` says what the prompt
    held. By default (`restack="measured"`) the LLM's own `restack` decides, which restacks where that was measured
    to help its model and method; `restack=None` answers the nodes in the order retrieved.
    """

    retriever: BaseRetriever
    llm: MidlensLLM
    node_postprocessors: list[BaseNodePostprocessor] = Field(default_factory=list)
    streaming: bool = False
    # A generators.answering.restack.Restack too, which the options' schema (a spec or None) does not describe.
    restack: Any = copy(EngineOptions.model_fields["restack"])

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: MidlensLLM | None = None,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str | None = None,
        method_options: dict[str, Any] | None = None,
        evidence: EvidenceConfig | None = None,
        node_postprocessors: Sequence[BaseNodePostprocessor] = (),
        streaming: bool = False,
        callback_manager: CallbackManager | None = None,
        verify: bool = _DEFAULTS.verify,
        restack: str | Restack | None = _DEFAULTS.restack,
        restack_rounds: int = _DEFAULTS.restack_rounds,
        **llm_kwargs: Any,
    ) -> None:
        """`verify=True` checks each citation (`Pipeline.verify`: the answer re-scored with the cited node removed,
        one prefill per cited node); it needs the model in this process, not a server."""
        # A bad scorer, round count or verify fails before the model loads.
        AnswerOptions(restack=restack, restack_rounds=restack_rounds, verify=verify)
        if llm is None:
            llm = MidlensLLM(model, method=method, method_options=method_options, evidence=evidence, **llm_kwargs)
        elif llm_kwargs or method_options or method is not None:
            raise ValueError("pass either llm=MidlensLLM(...) or model/method options, not both.")
        if verify and llm.base_url is not None:
            raise InvalidArgumentError(
                f"verify=True re-scores answers with the model, and this MidlensLLM answers through the server at "
                f"{llm.base_url}: use a MidlensLLM with a local model, or verify=False."
            )
        # The rerankers read the answering model's attention whichever was built first (one model in memory). A
        # MidlensLLM answered by a server has no model here to share (an AttentionReranker may use that server).
        for postprocessor in node_postprocessors:
            if isinstance(postprocessor, AttentionReranker) and llm.base_url is None:
                postprocessor.share_model(llm.generator.loaded)
        super().__init__(
            retriever=retriever,
            llm=llm,
            node_postprocessors=list(node_postprocessors),
            streaming=streaming,
            verify=verify,
            restack=restack,
            restack_rounds=restack_rounds,
            callback_manager=callback_manager or CallbackManager([]),
        )

    @classmethod
    def from_index(cls, index: Any, similarity_top_k: int = DEFAULT_TOP_K, **kwargs: Any) -> MidlensQueryEngine:
        """Over any LlamaIndex index (VectorStoreIndex on Faiss, Qdrant, ...): only its retriever is used."""
        similarity_top_k = check_top_k(similarity_top_k, "similarity_top_k")  # the index's retriever takes any int
        return cls(retriever=index.as_retriever(similarity_top_k=similarity_top_k), **kwargs)

    # How citations are marked in the text the engine answers with and in `marked_text` ("drop": unverified
    # sources get no marker, as in the citation engine's plain [n] shape).
    _unverified: ClassVar[Literal["mark", "drop"]] = "mark"

    def _scored(self, nodes: list[NodeWithScore], answer: Answer) -> tuple[list[NodeWithScore], dict[str, Any]]:
        """The one place an Answer becomes LlamaIndex sources (`_arrange`) and response metadata."""
        by_id = {n.node.node_id: n for n in nodes}
        stacked, metadata = [], {}
        for row, pe in zip(evidence_rows(answer), answer.passages, strict=True):
            if row["id"] not in by_id:  # dropped by truncate="drop_last": listed in metadata["midlens"]
                continue
            stacked.append((pe, by_id[row["id"]]))
            # Per node, whether the answer it sourced is likely supported (None: no support score).
            metadata[row["id"]] = {**row, "answer_supported": None if answer.support is None else answer.support.likely}
        kwargs = _response_kwargs(answer)
        kwargs.pop("answer")
        kwargs.pop("evidence")
        metadata["midlens"] = {
            **kwargs,
            "evidence_config": answer_to_wire(answer)["evidence_config"],
            "text": answer.text,
            "marked_text": marked_answer(answer, self._unverified).text,
            "citations": citation_rows(answer, self._unverified),
            "markers": {pe.position: node.node.node_id for pe, node in stacked},
            "restack": answer.restack,
        }
        return self._arrange(stacked), metadata

    def _arrange(self, stacked: list[tuple[PassageEvidence, NodeWithScore]]) -> list[NodeWithScore]:
        """The response's sources, from the stacked nodes in prompt order: strongest evidence first, scored by it."""
        ranked = sorted(stacked, key=lambda pair: pair[0].rank)
        return [NodeWithScore(node=node.node, score=pe.score) for pe, node in ranked]

    def _text(self, completion: CompletionResponse) -> str:
        """The response's text: the answer as generated."""
        return completion.text

    def _call(self) -> dict[str, Any]:
        """The LLM call's options the engine decides: restacking (none for "measured", so that the LLM's own
        `restack` field decides) and `verify`, which the answer path runs before abstaining reads the support."""
        verify = {"verify": True} if self.verify else {}
        if is_measured_restack(self.restack):
            return verify
        if self.restack is None:
            return {"restack": None, **verify}
        return {"restack": self.restack, "restack_rounds": self.restack_rounds, **verify}

    def _respond(self, nodes: list[NodeWithScore], completion: CompletionResponse) -> Response:
        sources, metadata = self._scored(nodes, completion.additional_kwargs["answer"])
        return Response(self._text(completion), source_nodes=sources, metadata=metadata)

    def _delta(
        self,
        response: StreamingResponse | AsyncStreamingResponse,
        nodes: list[NodeWithScore],
        chunk: CompletionResponse,
    ) -> str:
        """A streamed chunk's text delta. A sentence's citation, handed over once the next sentence has begun, is
        added to `metadata["midlens"]["citations"]` as it comes (unless the answer is to be verified: only the
        finished answer can be); the last chunk (its answer verified by then, when asked) swaps the response's
        sources for evidence-scored ones and replaces the metadata with the finished answer's."""
        if "citation" in chunk.additional_kwargs:
            if not self.verify:
                # Counted apart from the rows: a sentence that cites nothing has none, and still takes its number.
                run = response.metadata.setdefault("midlens", {"citations": [], "streamed_sentences": 0})
                run["citations"].extend(sentence_rows(chunk.additional_kwargs["citation"], run["streamed_sentences"]))
                run["streamed_sentences"] += 1
            return ""
        if "answer" in chunk.additional_kwargs:
            sources, metadata = self._scored(nodes, chunk.additional_kwargs["answer"])
            response.source_nodes[:] = sources
            response.metadata.clear()
            response.metadata.update(metadata)
        return chunk.delta or ""

    def custom_query(self, query_str: str) -> Response | StreamingResponse:
        bundle = QueryBundle(query_str)
        nodes = self.retriever.retrieve(bundle)
        for postprocessor in self.node_postprocessors:
            nodes = postprocessor.postprocess_nodes(nodes, query_bundle=bundle)
        if not nodes:
            return _empty()
        if not self.streaming:
            return self._respond(nodes, self.llm.complete(query_str, passages=nodes, **self._call()))
        chunks = self.llm.stream_complete(query_str, passages=nodes, **self._call())
        response = StreamingResponse(response_gen=None, source_nodes=list(nodes), metadata={})

        def tokens() -> Iterator[str]:
            for chunk in chunks:
                if delta := self._delta(response, nodes, chunk):
                    yield delta

        response.response_gen = tokens()
        return response

    async def acustom_query(self, query_str: str) -> Response | AsyncStreamingResponse:
        bundle = QueryBundle(query_str)
        nodes = await self.retriever.aretrieve(bundle)
        for postprocessor in self.node_postprocessors:
            nodes = await postprocessor.apostprocess_nodes(nodes, query_bundle=bundle)
        if not nodes:
            return _empty()
        if not self.streaming:
            completion = await self.llm.acomplete(query_str, passages=nodes, **self._call())
            return self._respond(nodes, completion)
        chunks = await self.llm.astream_complete(query_str, passages=nodes, **self._call())
        response = AsyncStreamingResponse(response_gen=None, source_nodes=list(nodes), metadata={})

        async def tokens() -> AsyncIterator[str]:
            async for chunk in chunks:
                if delta := self._delta(response, nodes, chunk):
                    yield delta

        response.response_gen = tokens()
        return response

    def as_chat_engine(self, **kwargs: Any) -> CondenseQuestionChatEngine:
        """A chat engine over this one: LlamaIndex's CondenseQuestionChatEngine, its follow-up questions made
        standalone by this engine's LLM, each answered by `query` (so `chat(...).sources[0].raw_output` is this
        engine's Response, evidence and citations in its metadata)."""
        kwargs.setdefault("llm", self.llm)
        return CondenseQuestionChatEngine.from_defaults(query_engine=self, **kwargs)
