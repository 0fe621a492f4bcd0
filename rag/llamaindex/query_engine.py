"""MidlensQueryEngine: a LlamaIndex CustomQueryEngine, retrieve -> stack -> generate, sources with evidence."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
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

from midlens.core.names import DEFAULT_TOP_K
from midlens.generators.evidence import Answer, EvidenceConfig
from midlens.generators.loading import LoadedModel
from midlens.generators.packaged_models import DEFAULT_MODEL
from midlens.rag.llamaindex.common import (
    _response_kwargs,
    evidence_rows,
)
from midlens.rag.llamaindex.llm import MidlensLLM


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
