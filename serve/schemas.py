"""The request side of OpenAI chat completions as `midlens serve` accepts them, and OpenAI's model list.

The rest of the wire format (midlens's own requests, every response, errors) is `midlens.rag.remote`, shared with
its client; FastAPI's OpenAPI page is generated from both. `/v1/chat/completions` takes what the OpenAI client and
LlamaIndex's OpenAILike send; passages to stack go in the request's own `midlens` object (`extra_body`), and the
response adds a `midlens` object (per-passage evidence) that OpenAI clients keep as an extra field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from midlens.rag.option_fields import option_model
from midlens.rag.remote import PassageIn

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


# The `midlens` object's answering options: a request's (rag/option_fields.py), less the decoding, which a chat
# request spells the OpenAI way (max_tokens, temperature, top_p, seed); calibrate None: the server's default.
ChatOptions = option_model(
    "ChatOptions",
    "request",
    exclude=("max_new_tokens", "temperature", "top_p", "seed"),
    deferred=("calibrate", "prompt_style"),
    strict_ints=True,
    unstreamed_note="Not with stream.",
    config=ConfigDict(extra="forbid"),
)


class ChatExtension(ChatOptions):
    """The request's `midlens` object: passages to stack under the last user message, and midlens's options (restack
    needs `passages`)."""

    passages: list[PassageIn] | None = Field(
        default=None,
        description="Stack these under the last user message (the RAG prompt, with evidence); without them the "
        "conversation goes through the model's chat template and has no passages to score.",
    )
    method: str | None = None
    marked: bool = Field(
        default=False,
        description="Write `[n]` after each cited sentence in message.content (n: the passage's position), so a stock "
        "OpenAI client shows the citations; the spans in midlens.citations index the text without them. Not with "
        "stream.",
    )


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    # OpenAI's other parameters (logprobs, user, presence_penalty, ...) are accepted and ignored, as clients send
    # several of them by default.
    model_config = ConfigDict(extra="allow")

    model: str | None = Field(default=None, description="The served model's name, or `NAME/METHOD-SPEC`.")
    messages: list[ChatMessage]
    # strict: "5" is refused, as OpenAI and the Python API refuse it; temperature in OpenAI's range.
    max_tokens: int | None = Field(default=None, ge=0, strict=True)
    max_completion_tokens: int | None = Field(default=None, ge=0, strict=True)
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0, description="0 to 2 as OpenAI's; default 0 (greedy), not OpenAI's 1."
    )
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="One choice per request.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(
        default=None,
        max_length=4,
        description="Up to 4 strings: the answer ends before the first one (after any leading whitespace; not with "
        "stream); a line break among them also stops decoding at the end of the first non-empty line.",
    )
    midlens: ChatExtension | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "midlens"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
