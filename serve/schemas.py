"""The wire format of `midlens serve`, as pydantic models (FastAPI's OpenAPI page is generated from them).

Two families:
  OpenAI chat completions   `/v1/chat/completions`, what the OpenAI client and LlamaIndex's OpenAILike send; the
                            response adds a `midlens` object (per-passage evidence) that OpenAI clients keep as an
                            extra field. Passages to stack go in the request's own `midlens` object (`extra_body`).
  midlens's own             `/v1/midlens/answer` and `/v1/midlens/score`: passages given explicitly, with ids.

Fields the library validates (an empty question, a method spec, a prompt over the window) are left to it, so the
HTTP answer carries the library's own message; the schemas check only shapes and ranges.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from midlens.core.names import DEFAULT_MAX_NEW_TOKENS

Truncate = Literal["error", "drop_last"]


class PassageIn(BaseModel):
    """One passage to stack into the prompt, in the order given."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The caller's id for this passage; evidence rows name it.")
    text: str
    title: str = ""
    score: float | None = Field(default=None, description="The caller's retrieval score, echoed in the evidence.")


class GenerationOptions(BaseModel):
    """What a request may set about decoding; None: the server's default."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = Field(default=None, ge=0, description="Longest answer in tokens (0: score only).")
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=0, description="Sampling seed (temperature > 0).")
    calibrate: bool = Field(default=True, description="Also compute calibrated evidence (content-free query).")


class AnswerRequest(GenerationOptions):
    question: str
    passages: list[PassageIn] = Field(default_factory=list)
    method: str | None = Field(default=None, description="Method spec (default: the server's); same weights.")
    truncate: Truncate = "error"
    prompt_style: str | None = Field(default=None, description="litm or short (default: the server's).")


class ScoreRequest(BaseModel):
    """Evidence for the passages without generating."""

    model_config = ConfigDict(extra="forbid")

    question: str
    passages: list[PassageIn] = Field(default_factory=list)
    method: str | None = None
    calibrate: bool = True
    truncate: Truncate = "error"
    prompt_style: str | None = None


class EvidenceRow(BaseModel):
    """One passage as the model saw it: its 1-based prompt position and the attention it received."""

    id: str
    title: str
    position: int
    retrieval_score: float | None
    evidence: float = Field(description="Attention mass the question's tokens gave the passage.")
    calibrated: float | None = Field(description="evidence minus that of a content-free question (None: skipped).")
    answer_attribution: float | None = Field(description="Attention mass the generated tokens gave it.")
    rank: int = Field(description="1 = strongest evidence (calibrated when computed, else raw).")
    score: float = Field(description="What `rank` orders by: calibrated when computed, else evidence.")


class MidlensResult(BaseModel):
    """midlens's reading of one answer: what `Answer` holds, JSON-ready (the `midlens` extension of a completion)."""

    model: str
    method: dict[str, Any]
    evidence_config: dict[str, Any]
    passages: list[EvidenceRow] = Field(description="Every stacked passage, in prompt order.")
    evidence: list[float] = Field(description="Each passage's score, in prompt order (the column `rank` orders).")
    dropped: list[str] = Field(default_factory=list, description="Ids of passages truncate='drop_last' left out.")
    prompt_tokens: int
    generated_tokens: int
    timings: dict[str, float]
    batch_size: int = Field(description="How many requests the server answered in the same batch as this one.")
    # Per-sentence citations, once `Answer` carries them; absent until then.
    citations: list[Any] | None = None


class AnswerResponse(MidlensResult):
    question: str
    text: str


# ---- OpenAI chat completions ----


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: accepted and ignored

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # the list form clients use for multi-part messages: its text parts
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class ChatExtension(BaseModel):
    """The request's `midlens` object: passages to stack under the last user message, and midlens's options."""

    model_config = ConfigDict(extra="forbid")

    passages: list[PassageIn] | None = Field(
        default=None,
        description="Stack these under the last user message (the RAG prompt, with evidence); without them the "
        "conversation goes through the model's chat template and has no passages to score.",
    )
    method: str | None = None
    calibrate: bool | None = None
    truncate: Truncate = "error"
    prompt_style: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # OpenAI's other parameters (logprobs, user, presence_penalty, ...) are accepted and ignored, as clients send
    # several of them by default.
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="The served model's name, or `NAME/METHOD-SPEC`.")
    messages: list[ChatMessage]
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0.0, description="Default 0 (greedy), not OpenAI's 1.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="One choice per request.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default=None, description="Not supported: must be left out.")
    midlens: ChatExtension | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChoiceMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ChoiceMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    midlens: MidlensResult


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed completion; the last one with choices carries `midlens`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    midlens: MidlensResult | None = None


# ---- the rest ----


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "midlens"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Spec(BaseModel):
    """What this server runs and the limits it enforces."""

    model: str
    method: dict[str, Any]
    method_spec: str
    methods: list[str] = Field(description="Method names a request may ask for (same weights).")
    context_window: int
    evidence_config: dict[str, Any]
    device: str
    dtype: str
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    prompt_style: str
    max_batch_size: int
    batch_wait_timeout_s: float
    request_timeout_s: float
    max_body_bytes: int


class Stats(BaseModel):
    """The batches this replica formed since it started: {size: count}."""

    replica: str
    pid: int
    batches: dict[int, int]
    requests: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, so OpenAI clients raise their own error classes with this message."""

    error: ErrorDetail
