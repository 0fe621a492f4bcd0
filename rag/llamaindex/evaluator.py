"""A LlamaIndex evaluator that checks a response written by any LLM against its contexts the way midlens checks its own
answers: each sentence cited from the attention of one teacher-forced pass (`Pipeline.check`), each citation verified
by ablation, and the sentences none of whose cited contexts they need named in the feedback, as
`FaithfulnessEvaluator` names a verdict.

    evaluator = MidlensEvaluator.from_model()   # the checking reader, core.defaults.CHECK_MODEL
    result = evaluator.evaluate_response(query=question, response=engine.query(question))
    result.passing, result.score, result.feedback
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.response.schema import Response
from llama_index.core.evaluation import BaseEvaluator, EvaluationResult
from llama_index.core.prompts.mixin import PromptDictType

from midlens.core.errors import InvalidArgumentError
from midlens.generators.answering.check import flagged, support_lines, supported_share
from midlens.rag.check_options import CheckOptions, check_options_from, check_options_only
from midlens.rag.llamaindex.common import PassageLike, node_passages
from midlens.rag.pipeline import Pipeline, marked_answer


class MidlensEvaluator(BaseEvaluator):
    """`passing`: every sentence rests on a context it needs; `score`: the share of sentences that do (a count, not a
    calibrated probability: no support model is fitted for answers this model did not write); `feedback`: the
    marked response and the sentences that may not be supported. `options` (rag.check_options.CheckOptions, or its
    fields by keyword): `verify=False` cites without ablation, and then only a sentence citing nothing fails
    (attention always lands on some context).

    `evaluate_response` reads the response's source nodes as CheckedQueryEngine does (`node_passages`: each named
    by its title or file), so both give the same response and nodes the same verdict; `evaluate` gets the contexts'
    texts alone, read as nodes without a name."""

    def __init__(self, pipeline: Pipeline, options: CheckOptions | None = None, **changes: Any) -> None:
        if pipeline.generator is None or pipeline.generator.citations is None:
            raise InvalidArgumentError(
                "MidlensEvaluator reads citations: pass a pipeline whose generator cites (citations on)."
            )
        self.options = check_options_only(options, changes, "llamaindex", pipeline.generator.loaded.name)
        self.pipeline = pipeline

    @property
    def verify(self) -> bool:
        return self.options.verify

    @classmethod
    def from_model(
        cls, model: str | None = None, options: CheckOptions | None = None, **keywords: Any
    ) -> MidlensEvaluator:
        """An evaluator over `model` (a packaged name or a model folder; None: the checking default,
        core.defaults.CHECK_MODEL); keywords that are CheckOptions' fields (`verify`) set them, the others go to
        `Generator` (method, device, dtype)."""
        from midlens.generators import Generator

        check, generator_options = check_options_from(options, {"model": model, **keywords}, "llamaindex")
        return cls(Pipeline(None, Generator(check.reader, **generator_options)), check)

    def evaluate(
        self,
        query: str | None = None,
        response: str | None = None,
        contexts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> EvaluationResult:
        # The work is one synchronous forward on the local model: no event loop to start for it.
        del kwargs
        return self._evaluate(query, response, contexts)

    def evaluate_response(
        self, query: str | None = None, response: Response | None = None, **kwargs: Any
    ) -> EvaluationResult:
        # Not BaseEvaluator's, which hands `evaluate` the nodes' texts: their names are part of the checked prompt.
        del kwargs
        if response is None:
            return self._evaluate(query, None, None)
        return self._evaluate(query, response.response, response.source_nodes)

    def _evaluate(
        self, query: str | None, response: str | None, sources: Sequence[PassageLike] | None
    ) -> EvaluationResult:
        if query is None or response is None or not sources:
            raise InvalidArgumentError(
                "MidlensEvaluator needs the query, the response and its contexts (the source nodes' texts): pass all "
                "three, or call evaluate_response(query, response) with a Response that has source_nodes."
            )
        passages = node_passages(sources)
        answer = self.pipeline.check(query, response, passages, self.options)
        doubts = flagged(answer)
        lines = [marked_answer(answer).text, *(f"{line}." for line in support_lines(answer))]
        if doubts:
            lines.append("May not be supported:")
            lines += [f"- {answer.text[c.span[0] : c.span[1]]} ({why})" for c, why in doubts]
        else:
            lines.append("Every sentence rests on a context" + (" it needs (verified)." if self.verify else "."))
        return EvaluationResult(
            query=query,
            response=response,
            contexts=[p.text for p in passages],
            passing=not doubts,
            score=supported_share(answer),
            feedback="\n".join(lines),
        )

    def _get_prompts(self) -> PromptDictType:
        return {}  # no prompt: the verdict is read from attention and ablation, not asked of an LLM

    def _update_prompts(self, prompts: PromptDictType) -> None:
        del prompts

    async def aevaluate(
        self,
        query: str | None = None,
        response: str | None = None,
        contexts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> EvaluationResult:
        return self.evaluate(query, response, contexts, **kwargs)

    async def aevaluate_response(
        self, query: str | None = None, response: Response | None = None, **kwargs: Any
    ) -> EvaluationResult:
        return self.evaluate_response(query, response, **kwargs)
