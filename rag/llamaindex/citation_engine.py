"""MidlensCitationQueryEngine: CitationQueryEngine's output, its citations read from the answer's attention."""

from __future__ import annotations

from typing import ClassVar, Literal

from llama_index.core.base.llms.types import CompletionResponse
from llama_index.core.schema import MetadataMode, NodeWithScore, TextNode

from midlens.generators.attention.evidence import PassageEvidence
from midlens.rag.llamaindex.query_engine import MidlensQueryEngine
from midlens.rag.pipeline import marked_answer


class MidlensCitationQueryEngine(MidlensQueryEngine):
    """A MidlensQueryEngine whose responses have the shape of `llama_index.core.query_engine.CitationQueryEngine`'s:
    `response.source_nodes[n - 1]` is source n, a node whose text reads "Source n:\\n<the node's text>\\n", and
    `response.response` is the answer with "[n]" after each sentence that cites source n.

    The stock engine asks the model to write those markers (an instruction a small model follows badly, and nothing
    checks them). Here the model answers the plain midlens prompt and the markers come from its attention: n is the
    node's position in the prompt, and a sentence is marked with the nodes its attention rests on
    (`generators.answering.citations`). With `verify=True` a citation the answer does not need (removing the node costs
    the sentence less than the margin) gets no marker; its row stays in `metadata["midlens"]["citations"]` with
    `verified=False`. Sources are whole nodes, one per node, keeping its id: the citation rows name the sentence
    inside the node (`node_chars`), finer than the stock engine's 512-token chunks. Sources come in prompt order,
    scored by calibrated evidence; `metadata` is MidlensQueryEngine's, `marked_chars` indexing `response.response`.

    Streaming yields the answer without markers (they follow from the finished answer's attention); once the stream
    is consumed, `metadata["midlens"]["marked_text"]` is the marked answer and the sources are the "Source n" nodes.
    """

    _unverified: ClassVar[Literal["mark", "drop"]] = "drop"

    @classmethod
    def class_name(cls) -> str:
        return "MidlensCitationQueryEngine"

    def _arrange(self, stacked: list[tuple[PassageEvidence, NodeWithScore]]) -> list[NodeWithScore]:
        sources = []
        for pe, retrieved in stacked:  # prompt order, so source n is the n-th
            text = retrieved.node.get_content(metadata_mode=MetadataMode.NONE)
            data = retrieved.node.model_dump()
            # The text changes (the "Source n:" heading), so offsets into the stored document no longer describe it.
            data.update(start_char_idx=None, end_char_idx=None)
            source = TextNode.model_validate(data)
            source.set_content(f"Source {pe.position}:\n{text}\n")
            sources.append(NodeWithScore(node=source, score=pe.score))
        return sources

    def _text(self, completion: CompletionResponse) -> str:
        return marked_answer(completion.additional_kwargs["answer"], self._unverified).text
