"""MidlensQueryEngine: a LlamaIndex CustomQueryEngine, retrieve -> Pipeline (stack, generate), sources with evidence."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.base.response.schema import (
    AsyncStreamingResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import CustomQueryEngine
from llama_index.core.schema import NodeWithScore, QueryBundle

from midlens.core.checks import check_top_k
from midlens.core.names import DEFAULT_TOP_K
from midlens.generators.evidence import Answer, EvidenceConfig
from midlens.generators.loading import LoadedModel
from midlens.generators.packaged_models import DEFAULT_MODEL
from midlens.rag.llamaindex.common import (
    _response_kwargs,
    evidence_rows,
)
from midlens.rag.llamaindex.llm import MidlensLLM
from midlens.rag.llamaindex.reranker import AttentionReranker


def _empty() -> Response:
    return Response("Empty Response", source_nodes=[], metadata={})


class MidlensQueryEngine(CustomQueryEngine):
    """retrieve -> (postprocess) -> stack -> generate, with evidence-scored sources.

    Retrieval and postprocessing are LlamaIndex's (an AttentionReranker given no model of its own scores with the
    engine's model, `AttentionReranker.share_model`); stacking and generation are the `llm`'s Pipeline
    (`MidlensLLM.pipeline`, the one `midlens ask` answers with), reached through the LLM's complete calls so that
    LlamaIndex's LLM events and callbacks fire as for any other engine.

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
        # The rerankers read the answering model's attention whichever was built first (one model in memory).
        for postprocessor in node_postprocessors:
            if isinstance(postprocessor, AttentionReranker):
                postprocessor.share_model(llm.generator.loaded)
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
        similarity_top_k = check_top_k(similarity_top_k, "similarity_top_k")  # the index's retriever takes any int
        return cls(retriever=index.as_retriever(similarity_top_k=similarity_top_k), **kwargs)

    @staticmethod
    def _scored(nodes: list[NodeWithScore], answer: Answer) -> tuple[list[NodeWithScore], dict[str, Any]]:
        """The one place an Answer becomes LlamaIndex sources (strongest evidence first) and response metadata."""
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

    def _respond(self, nodes: list[NodeWithScore], completion: CompletionResponse) -> Response:
        sources, metadata = self._scored(nodes, completion.additional_kwargs["answer"])
        return Response(completion.text, source_nodes=sources, metadata=metadata)

    def _delta(
        self,
        response: StreamingResponse | AsyncStreamingResponse,
        nodes: list[NodeWithScore],
        chunk: CompletionResponse,
    ) -> str:
        """A streamed chunk's text delta; the last chunk also swaps the response's sources for evidence-scored ones."""
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
            return self._respond(nodes, self.llm.complete(query_str, passages=nodes))
        chunks = self.llm.stream_complete(query_str, passages=nodes)
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
            return self._respond(nodes, await self.llm.acomplete(query_str, passages=nodes))
        chunks = await self.llm.astream_complete(query_str, passages=nodes)
        response = AsyncStreamingResponse(response_gen=None, source_nodes=list(nodes), metadata={})

        async def tokens() -> AsyncIterator[str]:
            async for chunk in chunks:
                if delta := self._delta(response, nodes, chunk):
                    yield delta

        response.response_gen = tokens()
        return response
