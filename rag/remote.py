"""A client of `midlens serve` and the wire format both sides share (pydantic models; httpx, no Ray, no FastAPI).

    client = MidlensClient("http://127.0.0.1:8000")
    out = client.answer("Who wrote X?", [{"id": "a", "text": "..."}], max_new_tokens=16)
    out.text, [(row.id, row.score) for row in out.passages]

The server (`midlens.serve`) validates requests and writes responses with these models, and this client sends and
reads them, so the two cannot drift apart; the library's integrations (`MidlensLLM.from_server(base_url)`) reach a
server through this module and never import the service itself.

A request the server refuses raises `ServerError` with the server's message (the library's own). A dropped
connection or a 502/503 (a replica that died mid-request, one still starting) is retried with backoff, a bounded
number of times: answers are deterministic for a seed, so asking again is safe. `connect` (what the LlamaIndex
classes given `base_url` call) asks for the spec at once and turns a URL nobody answers at into `ServerUnreachable`.

Fields the library validates (an empty question, a method spec, a prompt over the window) are left to it, so the
HTTP answer carries the library's own message; the schemas check only shapes and ranges.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS
from midlens.core.errors import MidlensError
from midlens.rag.check_options import CheckOptions
from midlens.rag.option_fields import option_model
from midlens.rag.options import FIELDS


class PassageIn(BaseModel):
    """One passage to stack into the prompt, in the order given."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="The caller's id for this passage; evidence rows name it.")
    text: str
    title: str = ""
    score: float | None = Field(default=None, description="The caller's retrieval score, echoed in the evidence.")


# A request's answering options: AnswerOptions' fields the server's requests spell (rag/option_fields.py writes them:
# the same names, defaults, bounds and help). None for the longest answer and the prompt's style: the server's default.
RequestOptions = option_model(
    "RequestOptions",
    "request",
    deferred=("max_new_tokens", "prompt_style"),
    strict_ints=True,  # a number sent as a string ("5") is refused, as the Python API refuses it
    config=ConfigDict(extra="forbid"),
)


class AnswerRequest(RequestOptions):
    question: str
    passages: list[PassageIn] = Field(default_factory=list)
    method: str | None = Field(default=None, description="Method spec (default: the server's); same weights.")


# A score request's options: AnswerOptions' calibrate, truncate and prompt_style as the server's requests spell them.
ScoreRequestOptions = option_model(
    "ScoreRequestOptions",
    "request",
    exclude=FIELDS - {"calibrate", "truncate", "prompt_style"},
    deferred=("prompt_style",),
    strict_ints=True,
    config=ConfigDict(extra="forbid"),
)


class ScoreRequest(ScoreRequestOptions):
    """Evidence for the passages without generating."""

    question: str
    passages: list[PassageIn] = Field(default_factory=list)
    method: str | None = None
    max_prompt_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Cap on the stacked prompt, below the model's context window (a reranker's pass size); with "
        "truncate='drop_last' the passages that fit under it are scored and the rest listed in `dropped`.",
    )


# A check request's options: CheckOptions' fields the server's check request spells (rag/option_fields.py writes
# them). None for the instruction: the server's default.
CheckRequestOptions = option_model(
    "CheckRequestOptions",
    "request",
    deferred=("prompt_style",),
    strict_ints=True,
    config=ConfigDict(extra="forbid"),
    options=CheckOptions,
)


class CheckRequest(CheckRequestOptions):
    """An answer written elsewhere, to cite against the passages it was written over (`Answering.check`)."""

    question: str
    answer: str = Field(description="The answer to check, as another model (or a person) wrote it.")
    passages: list[PassageIn] = Field(default_factory=list, description="Stacked in the order given.")
    method: str | None = Field(default=None, description="Method spec (default: the server's); same weights.")


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


# The fields are an answer's wire form, which generators.answering.answer_wire alone writes (the server) and reads
# back (the LlamaIndex classes given a `base_url`): declared here for the server's validation and OpenAPI schema, and
# held to the codec's keys by tests/test_answer_wire.py.
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
    citations: list[Any] | None = Field(
        default=None, description="Per answer sentence, the passages (and their sentences) it rests on."
    )
    restack: dict[str, Any] | None = Field(
        default=None, description="Restacked answers: the scorer, its rounds and scores, and what each slot held."
    )
    support: dict[str, Any] | None = Field(
        default=None,
        description="Whether to trust the answer: `probability` it is right (calibrated on the train split), `likely` "
        "(at or above the `threshold` in force and 0.5), `threshold_by` (who set it: `model` or `abstain_below`), "
        "`band` and `words` (as `midlens ask` prints it), `model` (the support model that answered), `methods` (the "
        "answering methods it was fitted on), `method` (the one that answered), `calibrated` (whether it is among "
        "them; if not, never `likely`), `passages_given` (false: no passage was given, band `none`) and `answered` "
        "(false: the answer restates the question, band `no-answer`, nothing rated); null with nothing generated.",
    )
    withheld: str | None = Field(
        default=None, description="With `abstain`: the answer withheld for too little support (the text says so)."
    )


class AnswerResponse(MidlensResult):
    question: str
    text: str


class CheckResponse(AnswerResponse):
    unsupported: list[tuple[int, int]] = Field(
        description="The characters in `text` of each sentence that may not be supported: it cites no passage, "
        "verified, needs none of those it cites, or the checked support model scores it below its threshold."
    )
    unsupported_why: list[str] = Field(default_factory=list, description="Why, for each of `unsupported`.")
    sentence_support: list[float] | None = Field(
        default=None,
        description="Each sentence's probability of being right (in `citations` order) under the checked-answer "
        "support model; `support` is the weakest's. Null where no such model ships for the server's model.",
    )
    support_note: str | None = Field(default=None, description="Why `support` is null for a checked answer.")


# ---- OpenAI chat completions (responses; the request's model is the server's) ----


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
    """One server-sent event of a streamed completion; the last one with choices carries `midlens`. A chunk with
    an empty delta and `midlens_citation` cites one answer sentence, sent as soon as the next sentence began (the
    last ones before the final chunk); the final `midlens.citations` repeats them all."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    midlens: MidlensResult | None = None
    midlens_citation: dict[str, Any] | None = Field(
        default=None, description="One answer sentence's citation: its span in the answer text and its sources."
    )


# ---- midlens's own ----


class Spec(BaseModel):
    """What this server runs and the limits it enforces."""

    model: str
    method: dict[str, Any]
    method_spec: str
    restack: str | None = Field(
        default=None,
        description="The scorer whose evidence restacks the passages of a request that asks for the server's method "
        "and names no restack (measured for the model and method), or null: answered in the order given.",
    )
    cite_evidence: str | None = Field(
        default=None,
        description="The method whose evidence of the prompt every answer's citations blend in (`midlens serve "
        "--cite-evidence`), or null: the answering pass's own.",
    )
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
    cancelled: int = Field(
        default=0, description="Requests that timed out or whose client left, and were not decoded to the end."
    )


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, so OpenAI clients raise their own error classes with this message."""

    error: ErrorDetail


# ---- the client ----

# A 500 is retried too: Ray's proxy answers 500 when the replica holding the request dies under it.
RETRY_STATUSES = (500, 502, 503)


class ServerError(MidlensError):
    """The server answered with an error: `status`, its message, OpenAI's `code` when it gave one."""

    def __init__(self, status: int, message: str, code: str | None = None):
        self.status = status
        self.code = code
        super().__init__(message)


class ServerUnreachable(MidlensError):
    """No server answered at the URL (refused, timed out, name unknown), after the client's retries."""


@contextmanager
def reaching(base_url: str) -> Iterator[None]:
    """httpx's transport errors as ServerUnreachable, in one sentence: httpx's traceback (connection pools, sockets)
    tells a caller nothing the URL and the reason do not."""
    try:
        yield
    except httpx.TransportError as err:
        reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise ServerUnreachable(
            f"no answer from a midlens server at {base_url} ({reason}): start one with `midlens serve`, or check the "
            "URL (a server still loading its model answers once it is ready)."
        ) from None


def passage_json(passage: Any) -> dict[str, Any]:
    """A passage as the server takes it: a dict, a midlens Passage, or anything with text/title/id/score."""
    if isinstance(passage, dict):
        return passage
    out = {"id": str(getattr(passage, "id", "") or ""), "text": passage.text, "title": getattr(passage, "title", "")}
    if getattr(passage, "score", None) is not None:
        out["score"] = float(passage.score)
    return out


def _error_of(response: httpx.Response) -> ServerError:
    try:
        error = response.json()["error"]
        return ServerError(response.status_code, error["message"], error.get("code"))
    except (ValueError, KeyError, TypeError):
        return ServerError(response.status_code, response.text.strip() or response.reason_phrase)


class MidlensClient:
    """Typed calls of every endpoint; `retries` bounds how often a dropped connection or a 5xx is asked again."""

    def __init__(
        self,
        base_url: str,
        timeout: float = 300.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: the server's key (`midlens serve --api-key`), sent as `Authorization: Bearer`; default
        $MIDLENS_API_KEY, as the server reads it."""
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        key = api_key if api_key is not None else os.environ.get("MIDLENS_API_KEY")
        headers = {"Authorization": f"Bearer {key}"} if key else None
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MidlensClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError:
                if last:
                    raise
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUSES or last:
                    raise _error_of(response)
            time.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def spec(self) -> Spec:
        return Spec.model_validate(self._send("GET", "/v1/midlens/spec").json())

    def stats(self) -> Stats:
        return Stats.model_validate(self._send("GET", "/v1/midlens/stats").json())

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def answer(self, question: str, passages: Sequence[Any] = (), **options: Any) -> AnswerResponse:
        """`options`: AnswerRequest's fields (max_new_tokens, temperature, top_p, seed, calibrate, method, truncate,
        prompt_style, restack, restack_rounds); a wrong name or type raises pydantic's ValidationError before
        anything is sent."""
        request = AnswerRequest(question=question, passages=[passage_json(p) for p in passages], **options)
        return AnswerResponse.model_validate(self._send("POST", "/v1/midlens/answer", _body(request)).json())

    def score(self, question: str, passages: Sequence[Any], **options: Any) -> MidlensResult:
        """`options`: ScoreRequest's fields (method, calibrate, truncate, prompt_style)."""
        request = ScoreRequest(question=question, passages=[passage_json(p) for p in passages], **options)
        return MidlensResult.model_validate(self._send("POST", "/v1/midlens/score", _body(request)).json())

    def check(self, question: str, answer: str, passages: Sequence[Any], **options: Any) -> CheckResponse:
        """`options`: CheckRequest's fields (method, verify, truncate, prompt_style)."""
        request = CheckRequest(
            question=question, answer=answer, passages=[passage_json(p) for p in passages], **options
        )
        return CheckResponse.model_validate(self._send("POST", "/v1/midlens/check", _body(request)).json())

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> ChatCompletion:
        """An OpenAI chat completion; `options` are its parameters (max_tokens, ..., midlens={...})."""
        body = {"messages": messages, **options}
        return ChatCompletion.model_validate(self._send("POST", "/v1/chat/completions", body).json())

    def stream_chat(self, messages: list[dict[str, Any]], **options: Any) -> Iterator[ChatCompletionChunk]:
        """The streamed chunks of a chat completion; an error event raises ServerError. A connection that fails
        before the first chunk is retried like any request; one that fails mid-stream raises."""
        body = {"messages": messages, **options, "stream": True}
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                    if response.status_code >= 400:
                        response.read()
                        if response.status_code not in RETRY_STATUSES or last:
                            raise _error_of(response)
                    else:
                        yield from _events(response)
                        return
            except httpx.ConnectError:  # nothing was yielded yet: safe to ask again
                if last:
                    raise
            time.sleep(self.backoff_s * 2**attempt)


def connect(
    base_url: str, timeout: float = 300.0, retries: int = 3, api_key: str | None = None
) -> tuple[MidlensClient, Spec]:
    """A client of the server at `base_url` and what it serves, asked now: a wrong or dead URL fails where the
    object that needs the server is built (ServerUnreachable), not at its first call; so does a wrong key."""
    client = MidlensClient(base_url, timeout=timeout, retries=retries, api_key=api_key)
    try:
        with reaching(client.base_url):
            return client, client.spec()
    except BaseException:
        client.close()
        raise


def _body(request: BaseModel) -> dict[str, Any]:
    # Only what the caller set: the server fills its own defaults (max_new_tokens, prompt_style, method).
    return request.model_dump(mode="json", exclude_unset=True)


def _events(response: httpx.Response) -> Iterator[ChatCompletionChunk]:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ServerError(200, event["error"]["message"], event["error"].get("code"))
        yield ChatCompletionChunk.model_validate(event)
