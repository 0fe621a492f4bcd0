"""The one pipeline every shell (CLI, LlamaIndex, demo, eval) calls: retrieve -> stack -> generate.

pipe = Pipeline.from_corpus(device="auto")         # embedded HotpotQA corpus, Qwen2.5-Coder-0.5B-Instruct, baseline
answer = pipe.ask("Who directed Wings of Desire?")
for p in answer.ranked(): print(p.rank, p.passage.title, p.calibrated)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from midlens.core.batch_size import BatchSize
from midlens.core.checks import check_max_new_tokens, check_prompt_style, check_question, check_top_k
from midlens.core.errors import InvalidArgumentError
from midlens.core.names import DEFAULT_MAX_NEW_TOKENS, DEFAULT_RETRIEVAL, DEFAULT_TOP_K
from midlens.core.passage import Passage
from midlens.generators.evidence import Answer, EvidenceConfig
from midlens.generators.generator import GenerationStream, Generator
from midlens.generators.loading import LoadedModel
from midlens.generators.methods.registry import MethodConfig, method_config
from midlens.generators.packaged_models import DEFAULT_MODEL
from midlens.generators.prompt import DEFAULT_STYLE, StackedPrompt
from midlens.generators.scheduling import generate_all
from midlens.retrievers.base import Retriever
from midlens.retrievers.build import Retrieval, build_retriever, check_retrieval
from midlens.retrievers.corpus import default_corpus_path
from midlens.retrievers.dense import IndexType


class Pipeline:
    def __init__(
        self,
        retriever: Retriever | None,
        generator: Generator,
        top_k: int = DEFAULT_TOP_K,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        truncate: Literal["error", "drop_last"] = "error",
        prompt_style: str = DEFAULT_STYLE,
    ):
        """`prompt_style`: the instruction above the passages (generators.prompt.STYLES). `retriever=None`: a
        pipeline that answers over passages its caller retrieved (`answer`, `answer_stream`), as a LlamaIndex engine
        does with its own retriever."""
        self.retriever = retriever
        self.generator = generator
        self.top_k = check_top_k(top_k)
        self.max_new_tokens = check_max_new_tokens(max_new_tokens)
        self.truncate = truncate
        self.prompt_style = check_prompt_style(prompt_style)

    @classmethod
    def from_corpus(
        cls,
        corpus: str | Path | None = None,
        model: str | LoadedModel = DEFAULT_MODEL,
        method: str | MethodConfig = "baseline",
        top_k: int = DEFAULT_TOP_K,
        index_dir: str | Path | None = None,
        index_type: IndexType = "flat",
        evidence: EvidenceConfig | None = None,
        device: str = "auto",
        dtype: str = "auto",
        prompt_style: str = DEFAULT_STYLE,
        retrieval: Retrieval = DEFAULT_RETRIEVAL,
        truncate: Literal["error", "drop_last"] = "error",
        **method_options,
    ) -> Pipeline:
        """`method` is a registry name or spec; `device`/`dtype`: auto = CUDA + bfloat16 when present, else CPU;
        `retrieval`: "dense" (faiss) or "hybrid" (dense + BM25 fused by rank, retrievers.hybrid); "+links" after
        either also stacks the passages whose titles the top 2 mention (retrievers.links)."""
        check_top_k(top_k)  # before the model loads
        check_prompt_style(prompt_style)
        check_retrieval(retrieval)
        method = method_config(method, method_options)  # a bad spec fails before the index and the model
        # Then the corpus: a missing or malformed one is reported before seconds of model loading.
        retriever = build_retriever(corpus or default_corpus_path(), retrieval, index_dir, index_type)
        generator = Generator(model, method=method, evidence=evidence, device=device, dtype=dtype)
        return cls(retriever, generator, top_k=top_k, truncate=truncate, prompt_style=prompt_style)

    def with_method(self, method: str | MethodConfig, **method_options) -> Pipeline:
        """The same retriever and loaded model, another method (weights are shared, not reloaded)."""
        generator = Generator(
            self.generator.loaded, method=method, evidence=self.generator.evidence_config, **method_options
        )
        return Pipeline(self.retriever, generator, self.top_k, self.max_new_tokens, self.truncate, self.prompt_style)

    def retrieve(self, question: str, top_k: int | None = None) -> list[Passage]:
        if self.retriever is None:
            raise InvalidArgumentError(
                "this pipeline has no retriever: pass the passages to answer() or answer_stream() instead."
            )
        # `top_k or self.top_k` would turn an explicit 0 into the default: only None means "the default".
        return self.retriever.search(question, self.top_k if top_k is None else check_top_k(top_k))

    def prompt(self, question: str, passages: list[Passage], max_new_tokens: int) -> StackedPrompt:
        """The stacked prompt this pipeline answers from (its truncation and instruction style)."""
        return self.generator.prompt(
            question, passages, max_new_tokens=max_new_tokens, truncate=self.truncate, style=self.prompt_style
        )

    def answer(self, question: str, passages: list[Passage], calibrate: bool = True, **generate_kwargs) -> Answer:
        """Generate over given passages (in the given prompt order), skipping retrieval."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        prompt = self.prompt(question, passages, max_new)
        return self.generator.generate(prompt, max_new_tokens=max_new, calibrate=calibrate, **generate_kwargs)

    def ask(self, question: str, top_k: int | None = None, calibrate: bool = True, **generate_kwargs) -> Answer:
        check_question(question)  # before retrieval, which would call it an empty query
        check_max_new_tokens(generate_kwargs.get("max_new_tokens", self.max_new_tokens))
        t0 = time.perf_counter()
        passages = self.retrieve(question, top_k)
        retrieve_s = time.perf_counter() - t0
        answer = self.answer(question, passages, calibrate=calibrate, **generate_kwargs)
        answer.timings = {"retrieve_s": retrieve_s, **answer.timings}
        return answer

    def ask_many(
        self, questions: list[str], batch_size: BatchSize = 1, calibrate: bool = True, **generate_kwargs
    ) -> list[Answer]:
        """`ask` for many questions, their prompts generated `batch_size` at a time (`auto`: the largest batch that
        fits on a GPU, 1 on the CPU); each Answer equals the question asked alone."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        for question in questions:  # all before the first retrieval
            check_question(question)
        prompts, retrieve_s = [], []
        for question in questions:
            t0 = time.perf_counter()
            passages = self.retrieve(question)
            retrieve_s.append(time.perf_counter() - t0)
            prompts.append(self.prompt(question, passages, max_new))
        answers = generate_all(
            self.generator, prompts, batch_size, max_new_tokens=max_new, calibrate=calibrate, **generate_kwargs
        )
        for answer, seconds in zip(answers, retrieve_s, strict=True):
            answer.timings = {"retrieve_s": seconds, **answer.timings}
        return answers

    def answer_stream(self, question: str, passages: list[Passage], **generate_kwargs) -> GenerationStream:
        """`answer` as text deltas; the prompt is built (and a too-long one refused) now, not on the first delta."""
        max_new = check_max_new_tokens(generate_kwargs.pop("max_new_tokens", self.max_new_tokens))
        prompt = self.prompt(question, passages, max_new)
        return self.generator.stream(prompt, max_new_tokens=max_new, **generate_kwargs)

    def ask_stream(self, question: str, top_k: int | None = None, **generate_kwargs) -> GenerationStream:
        check_question(question)
        return self.answer_stream(question, self.retrieve(question, top_k), **generate_kwargs)
