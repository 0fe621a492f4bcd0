"""AttentionReranker: a LlamaIndex node postprocessor scoring nodes by the attention the model gives them, with a
model in this process or through a `midlens serve` server (`base_url=`, the same name MidlensLLM takes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle

from midlens.core import defaults
from midlens.core.defaults import DEFAULT_MODEL, DEFAULT_PROMPT_STYLE
from midlens.core.errors import InvalidArgumentError, PromptTooLongError, Remedies
from midlens.core.passage import Passage
from midlens.rag.llamaindex.common import (
    _DEFERRED_LOAD,
    _RERANK_KEYS,
    GeneratorBacked,
    dispatcher,
    llm_models,
    logger,
    to_passage,
)

if TYPE_CHECKING:  # torch (and httpx) load with these, where a rerank needs them: importing the class stays light
    from midlens.generators.answering.generator import Generator
    from midlens.generators.models.loading import LoadedModel
    from midlens.generators.models.prompt import StackedPrompt
    from midlens.rag.remote import MidlensClient


def _warn_two_models(scoring: str, answering: list[str]) -> None:
    logger.warning(
        "AttentionReranker scores with %s while a MidlensLLM holds %s: two models in memory, and the "
        "reranker reads another model's attention than the one answering. Pass model=%r to share one.",
        scoring,
        ", ".join(answering),
        answering[-1],
    )


def _warn_served_model(scoring: str, base_url: str, answering: str) -> None:
    logger.warning(
        "AttentionReranker scores with %s on the server at %s while a MidlensLLM answers with %s: the reranker "
        "reads another model's attention than the one answering.",
        scoring,
        base_url,
        answering,
    )


class AttentionReranker(GeneratorBacked, BaseNodePostprocessor):
    """Rerank retrieved nodes by the attention a midlens generator gives them in one stacked forward pass.

    All nodes are stacked (in the given order) under the query; the score of a node is its evidence: the attention
    mass the model gives it (`score_by="evidence"`), or that minus the mass a content-free query gives it
    (`"calibrated"`). Unless told otherwise, the method and score are the best ranker measured for the model
    (core.defaults.RERANKERS): MuDAF's raw evidence for both packaged models (recall@2 of HotpotQA's supporting
    paragraphs 0.843 against dense retrieval's 0.608 on the default model); other models rank by the baseline's
    calibrated evidence.
    No tokens are decoded. Nodes that do not fit one window (or `max_tokens_per_pass`) are split into
    several passes of consecutive nodes; every node is scored, and each then carries `rerank_pass` /
    `rerank_passes` in its metadata, because scores from passes of different sizes are less comparable.
    A single node longer than the window is refused with PromptTooLongError.

    With `base_url` a `midlens serve` server scores the nodes (`/v1/midlens/score`, one request per pass) and no
    model loads here; the passes, scores, metadata and events are those of the server's model in this process.
    """

    top_n: int = Field(default=2, ge=1, description="Number of nodes to return sorted by score.")
    model: str | None = Field(
        default=None,
        description="Registry name or folder of the scoring model. Not named, it is the answering model's: the one "
        "MidlensQueryEngine hands over, else at first use the latest MidlensLLM's, else the default model.",
    )
    score_by: Literal["calibrated", "evidence"] | None = Field(
        default=None,
        description="Which evidence to rank by: raw attention mass or calibrated against a content-free query. None: "
        "the one measured best with the method in use (core.defaults.RERANKERS), else calibrated.",
    )
    keep_retrieval_score: bool = Field(default=False, description="Whether to keep the retrieval score in metadata.")
    max_tokens_per_pass: int | None = Field(
        default=None, ge=16, description="Cap on one stacked prompt (default: the model's context window)."
    )
    base_url: str | None = Field(
        default=None, description="A `midlens serve` server that scores instead of a model loaded in this process."
    )
    _named: bool = PrivateAttr(default=False)
    _client: MidlensClient | None = PrivateAttr(default=None)

    def __init__(
        self,
        top_n: int = 2,
        model: str | LoadedModel | None = None,
        base_url: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        """`kwargs`: the fields above, and method, method_options, evidence, device and dtype as in MidlensLLM;
        `api_key`: a `midlens serve` server's key (with `base_url`; default $MIDLENS_API_KEY).

        A named model loads now; without one nothing loads until the first rerank (or `share_model`), so a reranker
        built before its query engine's LLM ends up reading that LLM's attention, with one model in memory.
        `base_url` instead of a model: the server there scores (asked for its spec now, so a dead URL fails here),
        `method` is a spec run on its weights (default: the server's), `timeout` and `retries` are its client's;
        evidence, device and dtype are the server's to choose."""
        if base_url is None:
            super().__init__(model, top_n=top_n, **kwargs)
            self._named = model is not None
            return
        if model is not None:
            name = model if isinstance(model, str) else model.name
            raise InvalidArgumentError(
                f"AttentionReranker got model={name!r} and base_url={base_url!r}: pass model= to score in this "
                "process, or base_url= to score on a `midlens serve` server, not both."
            )
        for local in ("evidence", "device", "dtype", "method_options"):
            if kwargs.get(local):
                raise InvalidArgumentError(f"{local}= is the server's to choose: set it on `midlens serve`.")
            kwargs.pop(local, None)
        from midlens.rag.remote import connect

        client, spec = connect(base_url, timeout=timeout, retries=retries, api_key=api_key)
        # Past GeneratorBacked's constructor, which loads (or defers) a model: the fields describe the server's.
        BaseNodePostprocessor.__init__(
            self,
            top_n=top_n,
            model=spec.model,
            # Not named: the best ranker measured for the server's model, else the method the server runs.
            method=kwargs.pop("method", None) or defaults.RERANKERS.get(spec.model, (spec.method_spec,))[0],
            method_options={},
            device=spec.device,
            dtype=spec.dtype,
            base_url=client.base_url,
            **kwargs,
        )
        self._client = client
        self._named = True

    @property
    def generator(self) -> Generator:
        if self._client is not None:
            raise InvalidArgumentError(
                f"this AttentionReranker scores on the server at {self.base_url}: it has no Generator in this process."
            )
        return super().generator

    def _default_model(self) -> str | LoadedModel:
        models = llm_models()
        return models[-1] if models else DEFAULT_MODEL

    @classmethod
    def _default_method(cls, model: str | LoadedModel) -> str:
        """The best ranker measured for `model` (MuDAF's evidence for the packaged models), not its answering method."""
        from midlens.generators.models.packaged_models import default_reranker

        return default_reranker(model)[0]

    def _score_by(self) -> Literal["calibrated", "evidence"]:
        if self.score_by is not None:
            return self.score_by
        method, score = defaults.reranker_for(self.model)
        return score if self.method == method else "calibrated"

    def share_model(self, loaded: LoadedModel) -> bool:
        """Score with `loaded`, the answering LLM's model, unless this reranker was given a model of its own (then a
        different one is logged). Returns whether the reranker now reads `loaded`: never when it scores on a
        server, whose model is in another process (a different one is logged)."""
        if self._client is not None:
            if self.model != loaded.name:
                _warn_served_model(self.model, str(self.base_url), loaded.name)
            return False
        if self._named:
            if self.generator.loaded is not loaded:
                _warn_two_models(self.generator.loaded.name, [loaded.name])
            return self.generator.loaded is loaded
        with _DEFERRED_LOAD:
            if self._generator is None or self._generator.loaded is not loaded:
                self._set_generator(self._build_generator(loaded))
        return True

    def _on_generator(self) -> None:
        loaded = self.generator.loaded
        models = llm_models()
        others = sorted({m.name for m in models if m is not loaded})
        if others and all(m is not loaded for m in models):
            _warn_two_models(loaded.name, others)

    @classmethod
    def class_name(cls) -> str:
        return "AttentionReranker"

    def _passes(self, query: str, passages: list[Passage]) -> list[StackedPrompt]:
        """Consecutive groups of passages, each stacked into the fullest prompt that fits (the prompt builder's
        own fitting, so a pass holds exactly what `truncate='drop_last'` would keep)."""
        from midlens.generators.models.prompt import fit_windows

        window = self.generator.context_window
        limit = min(window, self.max_tokens_per_pass or window)
        prompts: list[StackedPrompt] = []
        try:
            for prompt in fit_windows(self.generator.tokenizer, passages, query, limit):
                prompts.append(prompt)
        except PromptTooLongError as err:
            if err.part != "passage":  # the query itself is too long: its own message says so
                raise
            first = passages[sum(len(p.passages) for p in prompts)]
            cap = "max_tokens_per_pass" if limit < window else "the context window"
            fix = "split documents into smaller nodes (SentenceSplitter(chunk_size=...)) or raise max_tokens_per_pass"
            raise PromptTooLongError(
                err.prompt_tokens,
                limit,
                passages=len(passages),
                part="passage",
                subject=f"node {first.id or '(no id)'}",
                remedies=Remedies(room=cap, split=fix),
            ) from None
        return prompts

    def _scores(self, query: str, passages: list[Passage]) -> list[list[float]]:
        """Each pass's scores, in node order; a pass holds as many nodes as its list."""
        by_evidence = self._score_by() == "evidence"
        if self._client is None:
            prompts = self._passes(query, passages)
            # Every window in one batch: each scores as it would alone (generators.answering.batch), in one pass of the
            # model.
            answers = self.generator.score_batch(prompts, calibrate=not by_evidence)
            return [[pe.evidence if by_evidence else pe.score for pe in a.passages] for a in answers]
        # The server fits each pass as fit_windows does here: the fullest prompt of the nodes left that fits its
        # window (or max_tokens_per_pass), the rest dropped for the next pass. It refuses a node that fits no pass.
        from midlens.rag.remote import ServerError, reaching

        passes: list[list[float]] = []
        cap = {} if self.max_tokens_per_pass is None else {"max_prompt_tokens": self.max_tokens_per_pass}
        remaining = passages
        with reaching(str(self.base_url)):
            while remaining:
                result = self._client.score(
                    query,
                    remaining,
                    method=self.method,
                    calibrate=not by_evidence,
                    truncate="drop_last",
                    prompt_style=DEFAULT_PROMPT_STYLE,  # fit_windows' style, which in-process passes are stacked in
                    **cap,
                )
                if not result.passages:  # drop_last refuses rather than score nothing; never loop on it
                    raise ServerError(200, f"the server at {self.base_url} scored none of {len(remaining)} nodes.")
                passes.append([row.evidence if by_evidence else row.score for row in result.passages])
                remaining = remaining[len(result.passages) :]
        return passes

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
        if self._client is None:
            _ = self.generator  # a deferred model loads here, before its name is reported
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
            passes = self._scores(query_bundle.query_str, [to_passage(n) for n in nodes])
            assert sum(len(scores) for scores in passes) == len(nodes)
            if len(passes) > 1:
                logger.warning(
                    "AttentionReranker: %d nodes did not fit one pass; scored them in %d passes.",
                    len(nodes),
                    len(passes),
                )
            index = 0
            for number, scores in enumerate(passes, start=1):
                for score in scores:
                    node = nodes[index]
                    if self.keep_retrieval_score:
                        node.node.metadata["retrieval_score"] = node.score
                    if len(passes) > 1:
                        node.node.metadata.update(rerank_pass=number, rerank_passes=len(passes))
                        for keys in (node.node.excluded_llm_metadata_keys, node.node.excluded_embed_metadata_keys):
                            keys.extend(k for k in _RERANK_KEYS if k not in keys)
                    node.score = score
                    index += 1
            # Stable sort: ties keep the retrieval order.
            new_nodes = sorted(nodes, key=lambda n: -(n.score or 0.0))[: self.top_n]
            event.on_end(payload={EventPayload.NODES: new_nodes})
        dispatcher.event(ReRankEndEvent(nodes=new_nodes))
        return new_nodes
