"""MidlensLLM answered by `midlens serve`: `MidlensLLM(base_url="http://127.0.0.1:8000")` is one of these.

It talks to the server through `midlens.rag.remote` (the client and the wire format), never through the service.

The same LlamaIndex class, the same calls (complete / stream_complete / chat / stream_chat and their async forms,
passages=[nodes...]), the same `additional_kwargs` (the Answer, its evidence rows), so MidlensQueryEngine and any
LlamaIndex code run unchanged against a server; no model is loaded in this process.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback

from midlens.core.errors import InvalidArgumentError
from midlens.core.passage import Passage
from midlens.generators.evidence import Answer, EvidenceConfig, PassageEvidence
from midlens.rag.llamaindex.citations import citations_from_json
from midlens.rag.llamaindex.llm import MidlensLLM, _as_chat, _completion
from midlens.rag.remote import ChatCompletionChunk, MidlensClient, MidlensResult, connect, passage_json


def answer_of(result: MidlensResult, question: str, text: str, passages: Sequence[Passage] = ()) -> Answer:
    """A server's `midlens` object as the library's Answer, its passages those the caller sent (in prompt order;
    passages the server dropped come last)."""
    sent = list(passages)
    evidence = [
        PassageEvidence(
            position=row.position,
            passage=sent[row.position - 1] if row.position <= len(sent) else Passage("", row.title, row.id),
            retrieval_score=row.retrieval_score,
            evidence=row.evidence,
            calibrated=row.calibrated,
            answer_attribution=row.answer_attribution,
            rank=row.rank,
        )
        for row in result.passages
    ]
    config = dict(result.evidence_config)
    if isinstance(config.get("heads"), list):  # JSON has no tuples; EvidenceConfig spells head lists as tuples
        config["heads"] = tuple(tuple(h) if isinstance(h, list) else h for h in config["heads"])
    answer = Answer(
        question=question,
        text=text,
        passages=evidence,
        model=result.model,
        method=result.method,
        evidence_config=EvidenceConfig(**config),
        prompt_tokens=result.prompt_tokens,
        generated_tokens=result.generated_tokens,
        timings=result.timings,
        dropped=sent[len(result.passages) :],
    )
    if result.citations is not None:  # JSON rows back into Citation objects, as a local Answer holds them
        answer.citations = citations_from_json(result.citations)
    return answer


class RemoteMidlensLLM(MidlensLLM):
    """A MidlensLLM whose calls go to a `midlens serve` server; see the module docstring."""

    _client: MidlensClient = PrivateAttr()
    _context_window: int = PrivateAttr()

    def __init__(
        self,
        model: str | None = None,
        base_url: str = "http://127.0.0.1:8000",
        method: str | None = None,
        timeout: float = 300.0,
        retries: int = 3,
        **kwargs: Any,
    ) -> None:
        """`model`: left out, or the served model's name; `method`: a spec run on the server's weights (default: the
        server's); the other fields are MidlensLLM's (max_new_tokens, temperature, truncate, prompt_style, ...)."""
        for local in ("evidence", "device", "dtype", "method_options"):
            if kwargs.get(local):
                raise InvalidArgumentError(f"{local}= is the server's to choose: set it on `midlens serve`.")
            kwargs.pop(local, None)
        client, spec = connect(base_url, timeout=timeout, retries=retries)
        if model is not None and model != spec.model:
            raise InvalidArgumentError(f"model={model!r}: the server at {base_url} runs {spec.model!r}.")
        # Past GeneratorBacked, whose constructor loads a model: the fields describe the server's.
        CustomLLM.__init__(
            self,
            model=spec.model,
            method=method or spec.method_spec,
            method_options={},
            device=spec.device,
            dtype=spec.dtype,
            base_url=base_url,
            **kwargs,
        )
        self._client = client
        self._context_window = spec.context_window

    @classmethod
    def class_name(cls) -> str:
        return "MidlensLLM"

    @property
    def client(self) -> MidlensClient:
        return self._client

    @property
    def pipeline(self):
        raise InvalidArgumentError("this MidlensLLM answers through a server: it has no local Pipeline.")

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self._context_window,
            num_output=self.max_new_tokens,
            is_chat_model=False,
            model_name=f"{self.model}/{self.method}",
        )

    def _midlens(self, passages: Sequence[Passage] | None, options: dict[str, Any]) -> dict[str, Any]:
        ext: dict[str, Any] = {"method": self.method, "calibrate": options["calibrate"]}
        if passages is not None:
            ext.update(
                passages=[passage_json(p) for p in passages], truncate=self.truncate, prompt_style=self.prompt_style
            )
        return ext

    @staticmethod
    def _openai(options: dict[str, Any]) -> dict[str, Any]:
        return {
            "max_tokens": options["max_new_tokens"],
            "temperature": options["temperature"],
            "top_p": options["top_p"],
            "seed": options["seed"],
        }

    def _complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        question, passages, options = self._request(prompt, formatted, kwargs)
        out = self._client.answer(
            question,
            [passage_json(p) for p in passages],
            method=self.method,
            truncate=self.truncate,
            prompt_style=self.prompt_style,
            **options,
        )
        return _completion(answer_of(out, out.question, out.text, passages))

    def _remote_stream(
        self, messages: list[dict[str, Any]], passages: list[Passage] | None, options: dict[str, Any], question: str
    ) -> CompletionResponseGen:
        events = self._client.stream_chat(messages, **self._openai(options), midlens=self._midlens(passages, options))
        first = next(events)  # sent now: a refused request raises at call time, not on the first next()

        def chunks() -> CompletionResponseGen:
            text = ""
            for event in _chain(first, events):
                delta = event.choices[0].delta.content if event.choices else None
                if event.midlens is not None:
                    answer = answer_of(event.midlens, question, text + (delta or ""), passages or [])
                    yield _completion(answer, delta=delta or "")
                    return
                if delta:
                    text += delta
                    yield CompletionResponse(text=text, delta=delta)

        return chunks()

    def _stream(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        question, passages, options = self._request(prompt, formatted, kwargs)
        return self._remote_stream([{"role": "user", "content": question}], passages, options, question)

    def _chat_request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> tuple[list[dict], dict]:
        passages, options = self._options(kwargs)
        if passages:
            raise TypeError("chat() takes no passages: use complete(question, passages=[...]) or MidlensQueryEngine.")
        options["calibrate"] = False
        return [{"role": m.role.value, "content": m.content or ""} for m in messages], options

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        turns, options = self._chat_request(messages, kwargs)
        done = self._client.chat(turns, **self._openai(options), midlens=self._midlens(None, options))
        text = done.choices[0].message.content
        return _as_chat(_completion(answer_of(done.midlens, turns[-1]["content"], text)))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        turns, options = self._chat_request(messages, kwargs)
        return (_as_chat(c) for c in self._remote_stream(turns, None, options, turns[-1]["content"]))


def _chain(first: ChatCompletionChunk, rest: Iterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
    yield first
    yield from rest
