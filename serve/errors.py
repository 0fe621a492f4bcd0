"""Errors as HTTP answers: a status, OpenAI's error shape, and the library's own message (never a traceback).

A request the library refuses (an empty question, an unknown method, a prompt over the window) is a 400 with the
message the library gives in-process and a `code` of CODES, which clients branch on: a code names the case, so it
stays when the class that raised it is renamed or subclassed (as a Python class name would not). A prompt over
the window is worded for this API by `PromptTooLongError.describe(HTTP_REMEDIES)`, as the CLI words it for its
options. A step the library advises (clear a cached model, train an artefact) is not the client's to run: it reads
as one for the server's operator.
"""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from midlens.core.errors import MethodConfigError, MidlensError, PromptTooLongError, Step
from midlens.rag.remote import ErrorDetail, ErrorResponse
from midlens.serve.engine import HTTP_REMEDIES, ArtefactRefused, Cancelled, ModelNotServed, TooMuchWork

logger = logging.getLogger("midlens.serve")


class RequestTimeout(MidlensError):
    """A request outlived the server's request timeout."""


class BodyTooLarge(MidlensError):
    """A request body is over the server's size limit."""


def error_response(status: int, message: str, kind: str, code: str | None = None, param: str | None = None):
    body = ErrorResponse(error=ErrorDetail(message=message, type=kind, code=code, param=param))
    return JSONResponse(body.model_dump(), status_code=status)


def operator_step(step: Step) -> str:
    """A step in this API's words: the client cannot run it, the server's operator can."""
    return f"ask the server's operator to {step.what}"


# Every `code` this server answers with, and the case it names: OpenAI's code where OpenAI has one for the case. A
# code names the case, not the class that raised it: one code for all the library's other refusals of a request.
CODES = {
    "context_length_exceeded": "a prompt over the model's window or the server's --max-prompt-tokens",
    "model_not_found": "a model this server does not run",
    "invalid_method": "an unknown method, or options it does not take",
    "artefact_not_allowed": "a method naming an artefact folder",
    "limit_exceeded": "more work than one of the server's limits allows (passages, answer tokens, restack "
    "rounds, a method's cost)",
    "invalid_request": "any other refusal of the request (an empty question, a bad value)",
    "invalid_body": "a body that is not a JSON object",
    "json_invalid": "a body that is not valid JSON",
    "invalid_api_key": "a missing or wrong API key (401)",
    "not_found": "no such route",
    "method_not_allowed": "an HTTP method the route does not take",
    "body_too_large": "a body over --max-body-bytes",
    "request_timeout": "a request past --request-timeout",
    "request_cancelled": "a request stopped before its answer was done",
    "server_error": "an error of the server's own",
}


def _refusal_code(err: MidlensError) -> str:
    if isinstance(err, TooMuchWork):
        return err.code
    if isinstance(err, MethodConfigError):
        return "invalid_method"
    if isinstance(err, ArtefactRefused):
        return "artefact_not_allowed"
    return "invalid_request"


def describe(err: BaseException) -> tuple[int, str, str, str]:
    """(status, message, OpenAI error type, code) for an exception raised while answering a request."""
    if isinstance(err, PromptTooLongError):
        return 400, err.describe(HTTP_REMEDIES), "invalid_request_error", "context_length_exceeded"
    if isinstance(err, ModelNotServed):
        return 404, str(err), "invalid_request_error", "model_not_found"
    if isinstance(err, RequestTimeout):
        return 504, str(err), "timeout", "request_timeout"
    if isinstance(err, Cancelled):
        return 504, str(err), "timeout", "request_cancelled"
    if isinstance(err, BodyTooLarge):
        return 413, str(err), "invalid_request_error", "body_too_large"
    if isinstance(err, MidlensError):
        return 400, err.render(steps=operator_step), "invalid_request_error", _refusal_code(err)
    if isinstance(err, ValueError | TypeError):
        return 400, str(err), "invalid_request_error", "invalid_request"
    logger.exception("internal error", exc_info=err)
    return 500, f"internal error: {type(err).__name__}: {err}", "server_error", "server_error"


async def on_error(request: Request, err: Exception) -> JSONResponse:
    status, message, kind, code = describe(err)
    return error_response(status, message, kind, code)


ROUTES = "/v1/chat/completions, /v1/models, /v1/midlens/answer, /v1/midlens/score, /v1/midlens/spec"


async def on_http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    """Starlette's own answers (no such route, a method the route does not take) in OpenAI's error shape, which
    clients parse, instead of `{"detail": ...}`."""
    if err.status_code == 404:
        message = f"no route {request.url.path}: this server answers {ROUTES} (no /v1/completions: use chat)."
        return error_response(404, message, "invalid_request_error", "not_found")
    if err.status_code == 405:
        message = f"{request.method} is not accepted on {request.url.path}."
        return error_response(405, message, "invalid_request_error", "method_not_allowed")
    if err.status_code >= 500:
        return error_response(err.status_code, str(err.detail), "server_error", "server_error")
    return error_response(err.status_code, str(err.detail), "invalid_request_error", "invalid_request")


def _location(loc: tuple) -> str:
    return ".".join(str(part) for part in loc if part != "body") or "body"


async def on_invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    """FastAPI's validation errors in one sentence: a body that is not JSON says where it breaks; a field says which
    field and what is wrong with it."""
    errors = err.errors()
    for item in errors:
        if tuple(item.get("loc", ())) == ("body",) and item.get("type") in ("model_attributes_type", "dict_type"):
            content_type = request.headers.get("content-type", "none")
            return error_response(
                400,
                f"the request body must be a JSON object sent as Content-Type: application/json (got {content_type}).",
                "invalid_request_error",
                "invalid_body",
            )
        if item.get("type") == "json_invalid":
            where = item.get("ctx", {}).get("error", "")
            return error_response(
                400, f"the request body is not valid JSON: {where}.", "invalid_request_error", "json_invalid"
            )
    parts = []
    for item in errors:
        where = _location(tuple(item.get("loc", ())))
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    first = errors[0] if errors else {}
    return error_response(
        400,
        "invalid request: " + "; ".join(parts) + ".",
        "invalid_request_error",
        "invalid_request",
        _location(tuple(first.get("loc", ()))) if first else None,
    )
