"""MidlensLLM: a LlamaIndex CustomLLM over the midlens Generator; evidence in `additional_kwargs`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback

from midlens.core.names import DEFAULT_MAX_NEW_TOKENS
from midlens.generators.evidence import EvidenceConfig
from midlens.generators.generator import Generator
from midlens.generators.loading import LoadedModel
from midlens.generators.packaged_models import DEFAULT_MODEL
from midlens.generators.prompt import StackedPrompt, chat_prompt
from midlens.rag.llamaindex.common import (
    _LLM_MODELS,
    GENERATE_OPTIONS,
    _drain_in_thread,
    _make_generator,
    _response_kwargs,
    to_passage,
)


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
        if all(m is not generator.loaded for m in _LLM_MODELS):
            _LLM_MODELS.append(generator.loaded)

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
