"""CheckedQueryEngine: the Response of any LlamaIndex query engine, whatever LLM wrote it, cited and checked by midlens.

It wraps the engine as LlamaIndex's own `RetryQueryEngine` and `TransformQueryEngine` do: node postprocessors run
before the answer exists and event handlers cannot change what `query` returns, so the place to add citations to a
finished answer is where the wrapped engine hands its Response back. The response text is read over the response's
own source nodes by `Pipeline.check` (one teacher-forced pass; with `verify`, each cited node removed in turn and the
sentence re-scored), so the citations say which node each sentence rests on, not which node the LLM was told about.

    engine = CheckedQueryEngine.from_model(index.as_query_engine(llm=any_llm))  # core.defaults.CHECK_MODEL reads
    response = engine.query("Who directed Wings of Desire?")
    response.response                              # "... Wim Wenders [2]."  ([n]: response.source_nodes[n - 1])
    response.metadata["midlens"]["citation_blocks"]  # LlamaIndex CitationBlocks, `source` the node id
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.response.schema import (
    RESPONSE_TYPE,
    AsyncStreamingResponse,
    PydanticResponse,
    Response,
    StreamingResponse,
)
from llama_index.core.callbacks import CallbackManager
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import QueryBundle

from midlens.core.errors import InvalidArgumentError
from midlens.rag.check_options import CheckOptions, check_options_from, check_options_only

if TYPE_CHECKING:  # torch loads slowly: the model parts are imported when a response is first checked
    from midlens.generators.answering.answer import Answer
    from midlens.generators.answering.citations import Citation
    from midlens.rag.pipeline import Pipeline

# What LlamaIndex's engines answer when retrieval found nothing: no sources to check against.
EMPTY_RESPONSE = "Empty Response"


class CheckedQueryEngine(BaseQueryEngine):
    """`query` runs the wrapped engine, then checks its answer over its source nodes and returns a Response with:

    - `response`: the answer with "[n]" after each sentence, n the cited node's place in `source_nodes` (1-based, as
      in LlamaIndex's CitationQueryEngine); with `verify`, only the nodes the sentence needs are marked (removing
      the node costs the sentence at least `CitationConfig.margin` nats). `mark=False` keeps the text as written.
    - `source_nodes`: the wrapped engine's, unchanged, in its order.
    - `metadata`: the wrapped engine's, plus `metadata["midlens"]`: `text` (the answer as written), `marked_text`,
      `citation_blocks` (LlamaIndex `CitationBlock`s, one per sentence and node it rests on, `source` the node id;
      with `verify`, only nodes the sentence needs),
      `citations` (JSON rows, as MidlensQueryEngine's), `markers` (n -> node id), `unsupported` (the sentences that
      rest on no node they need), `supported_share`, `support` (the checked support model's verdict, None where none
      ships for the model, `support_note` saying so), `sentence_support` (each sentence's), `evidence` per node, the
      model, method, token counts and timings of the check.

    A streaming engine's answer is read to its end first: the check needs the whole text, so the result is a plain
    Response. A response with no source nodes (retrieval found nothing) comes back as it was, with
    `metadata["midlens"] = {"checked": False, "reason": ...}`."""

    def __init__(
        self,
        query_engine: BaseQueryEngine,
        pipeline: Pipeline,
        options: CheckOptions | None = None,
        mark: bool = True,
        callback_manager: CallbackManager | None = None,
        **changes: Any,
    ) -> None:
        if not isinstance(query_engine, BaseQueryEngine):
            raise InvalidArgumentError(
                f"CheckedQueryEngine wraps a LlamaIndex query engine (a BaseQueryEngine, e.g. "
                f"index.as_query_engine(llm=...)); got {type(query_engine).__name__}."
            )
        if getattr(pipeline, "generator", None) is None or pipeline.generator.citations is None:
            raise InvalidArgumentError(
                "CheckedQueryEngine reads citations: pass a midlens Pipeline whose generator cites (citations on), "
                "or build it with CheckedQueryEngine.from_model(engine, model=...)."
            )
        self.options = check_options_only(options, changes, "llamaindex", pipeline.generator.loaded.name)
        self._query_engine = query_engine
        self.pipeline = pipeline
        self.mark = mark
        super().__init__(callback_manager)

    @classmethod
    def from_model(
        cls,
        query_engine: BaseQueryEngine,
        model: str | None = None,
        options: CheckOptions | None = None,
        mark: bool = True,
        **keywords: Any,
    ) -> CheckedQueryEngine:
        """Checks with `model` (a packaged name or a model folder; None: the checking default,
        core.defaults.CHECK_MODEL); keywords that are CheckOptions' fields (`verify`) set them, the others go to
        `Generator` (method, device, dtype). The checking model need not be the one that answered: it reads the
        answer, it does not write it."""
        from midlens.generators import Generator
        from midlens.rag.pipeline import Pipeline

        check, generator_options = check_options_from(options, {"model": model, **keywords}, "llamaindex")
        return cls(query_engine, Pipeline(None, Generator(check.reader, **generator_options)), check, mark)

    @property
    def verify(self) -> bool:
        return self.options.verify

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"query_engine": self._query_engine}  # the prompts are the wrapped engine's; the check asks none

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        response = self._query_engine.query(query_bundle)
        return self.check_response(query_bundle.query_str, _finished(response))

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        response = await self._query_engine.aquery(query_bundle)
        if isinstance(response, AsyncStreamingResponse):
            response = await response.get_response()
        # The check runs the model: in a worker thread, so the event loop stays free meanwhile.
        return await asyncio.to_thread(self.check_response, query_bundle.query_str, _finished(response))

    def check_response(self, query: str, response: Response) -> Response:
        """A Response obtained elsewhere (any engine's, or one built by hand), checked over its source nodes."""
        text = response.response
        if not response.source_nodes or not text or not text.strip() or text == EMPTY_RESPONSE:
            reason = "no source nodes to check against" if not response.source_nodes else "no answer text to check"
            return Response(
                text,
                source_nodes=list(response.source_nodes),
                metadata={**(response.metadata or {}), "midlens": {"checked": False, "reason": reason}},
            )
        from midlens.rag.llamaindex.common import node_passages

        passages = node_passages(response.source_nodes)
        answer = self.pipeline.check(query, text, passages, self.options)
        run = checked_metadata(answer)
        return Response(
            run["marked_text"] if self.mark else text,
            source_nodes=list(response.source_nodes),
            metadata={**(response.metadata or {}), "midlens": run},
        )


def checked_metadata(answer: Answer) -> dict[str, Any]:
    """A checked answer as `metadata["midlens"]`: its marks, citations (rows and CitationBlocks), support and
    evidence. Unverified sources get no marker: a sentence marked only with nodes it needs reads as checked."""
    from midlens.generators.answering.answer_wire import answer_to_wire
    from midlens.generators.answering.check import (
        NO_SUPPORT_MODEL,
        sentence_support,
        supported_share,
        unsupported,
        verified,
    )
    from midlens.rag.llamaindex.citation_blocks import citation_blocks
    from midlens.rag.llamaindex.citations import citation_rows
    from midlens.rag.llamaindex.common import evidence_rows
    from midlens.rag.pipeline import marked_answer

    passages = [p.passage for p in sorted(answer.passages, key=lambda p: p.position)]
    wire = answer_to_wire(answer)  # what the answer's one JSON form says of the run: model, method, tokens, timings

    return {
        "checked": True,
        "text": answer.text,
        "marked_text": marked_answer(answer, "drop").text,
        "citation_blocks": [block for c in answer.citations for block in citation_blocks(_kept(c), passages)],
        "citations": citation_rows(answer, "drop"),
        "markers": {pe.position: pe.passage.id for pe in answer.passages},
        "verified": verified(answer),
        "unsupported": [answer.text[c.span[0] : c.span[1]] for c in unsupported(answer)],
        "supported_share": supported_share(answer),
        "support": wire["support"],
        "sentence_support": sentence_support(answer),
        "support_note": NO_SUPPORT_MODEL if answer.support is None else None,
        "evidence": evidence_rows(answer),
        **{key: wire[key] for key in ("model", "method", "prompt_tokens", "timings", "dropped")},
    }


def _kept(citation: Citation) -> Citation:
    """The citation without the sources verification rejected: as the markers, a block names only what was needed."""
    return replace(citation, sources=[s for s in citation.sources if s.verified is not False])


def _finished(response: RESPONSE_TYPE) -> Response:
    """The wrapped engine's answer as one Response: a stream read to its end; structured output refused."""
    if isinstance(response, StreamingResponse):
        return response.get_response()
    if isinstance(response, PydanticResponse):
        raise InvalidArgumentError(
            "CheckedQueryEngine checks prose answers sentence by sentence; this engine returned structured output "
            "(a PydanticResponse). Wrap an engine without output_cls, or check a text field yourself with "
            "Pipeline.check(question, text, passages)."
        )
    if not isinstance(response, Response):
        raise InvalidArgumentError(
            f"CheckedQueryEngine needs a Response from the wrapped engine; it returned {type(response).__name__}."
        )
    return response
