"""A plain HTTP client of `midlens serve` (httpx; no Ray, no FastAPI), with bounded retries.

    client = MidlensClient("http://127.0.0.1:8000")
    out = client.answer("Who wrote X?", [{"id": "a", "text": "..."}], max_new_tokens=16)
    out["text"], [(row["id"], row["score"]) for row in out["passages"]]

A request the server refuses raises `ServerError` with the server's message (the library's own). A dropped
connection or a 502/503 (a replica that died mid-request, one still starting) is retried with backoff, a bounded
number of times: answers are deterministic for a seed, so asking again is safe.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from midlens.core.errors import MidlensError

# A 500 is retried too: Ray's proxy answers 500 when the replica holding the request dies under it.
RETRY_STATUSES = (500, 502, 503)


class ServerError(MidlensError):
    """The server answered with an error: `status`, its message, OpenAI's `code` when it gave one."""

    def __init__(self, status: int, message: str, code: str | None = None):
        self.status = status
        self.code = code
        super().__init__(message)


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
    def __init__(self, base_url: str, timeout: float = 300.0, retries: int = 3, backoff_s: float = 1.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

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

    def spec(self) -> dict[str, Any]:
        return self._send("GET", "/v1/midlens/spec").json()

    def stats(self) -> dict[str, Any]:
        return self._send("GET", "/v1/midlens/stats").json()

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def answer(self, question: str, passages: Sequence[Any] = (), **options: Any) -> dict[str, Any]:
        """`options`: max_new_tokens, temperature, top_p, seed, calibrate, method, truncate, prompt_style."""
        body = {"question": question, "passages": [passage_json(p) for p in passages], **options}
        return self._send("POST", "/v1/midlens/answer", body).json()

    def score(self, question: str, passages: Sequence[Any], **options: Any) -> dict[str, Any]:
        body = {"question": question, "passages": [passage_json(p) for p in passages], **options}
        return self._send("POST", "/v1/midlens/score", body).json()

    def chat(self, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
        """An OpenAI chat completion; `options` are its parameters (max_tokens, ..., midlens={...})."""
        return self._send("POST", "/v1/chat/completions", {"messages": messages, **options}).json()

    def stream_chat(self, messages: list[dict[str, Any]], **options: Any) -> Iterator[dict[str, Any]]:
        """The streamed chunks of a chat completion, as dicts; an error event raises ServerError. A connection that
        fails before the first chunk is retried like any request; one that fails mid-stream raises."""
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


def _events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        event = json.loads(data)
        if "error" in event:
            raise ServerError(200, event["error"]["message"], event["error"].get("code"))
        yield event
