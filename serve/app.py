"""The Ray Serve application: one deployment whose replicas each hold the model, behind a FastAPI ingress.

    POST /v1/chat/completions    OpenAI chat completions (JSON or server-sent events) + a `midlens` extension
    POST /v1/midlens/answer      answer over passages given with ids, evidence per passage
    POST /v1/midlens/score       evidence without generating
    POST /v1/midlens/check       cite (and verify) an answer written elsewhere over passages given with ids
    GET  /v1/midlens/spec        model, method, limits;  GET /v1/midlens/stats  batches this replica formed
    GET  /v1/models, /healthz, /readyz, /docs (OpenAPI)

Requests reach `_batch`, a `@serve.batch` method: Ray Serve gathers those that arrive within `batch_wait_timeout_s`
(at most `max_batch_size`) and the engine answers them in one `generate_batch` per group of equal decoding options,
on one worker thread, so the event loop keeps streaming tokens and answering health checks meanwhile.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' body types from their annotations, and the
# class reaches a replica pickled by value, where string annotations would name globals it does not carry.
import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS
from midlens.core.errors import InvalidArgumentError, MidlensError
from midlens.generators.answering.check import NO_SUPPORT_MODEL, flagged, sentence_support
from midlens.generators.answering.citations import Citation
from midlens.generators.models.packaged_models import DEFAULT_MODEL
from midlens.generators.models.prompt import DEFAULT_STYLE
from midlens.rag.pipeline import marked_answer
from midlens.rag.remote import (
    AnswerRequest,
    AnswerResponse,
    ChatCompletion,
    ChatCompletionChunk,
    CheckRequest,
    CheckResponse,
    ErrorResponse,
    MidlensResult,
    ScoreRequest,
    Spec,
    Stats,
)
from midlens.serve.engine import Engine, Job, Limits, Outcome, citation_json, result_of
from midlens.serve.errors import (
    BodyTooLarge,
    RequestTimeout,
    describe,
    error_response,
    on_error,
    on_http_error,
    on_invalid,
)
from midlens.serve.schemas import ChatCompletionRequest, ModelList

APP_NAME = "midlens"
DEFAULT_PORT = 8000
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: hundreds of passages; anything larger is far over any window here
DEFAULT_START_TIMEOUT_S = 180.0


@dataclass
class ServeOptions:
    """Everything `midlens serve` decides; a replica receives it as a dict."""

    model: str = DEFAULT_MODEL
    method: str | None = None  # None: the model's measured default
    device: str = "auto"
    dtype: str = "auto"
    evidence_layers: str = "upper"
    evidence_query: str = "question"
    evidence_heads: str = "all"
    prompt_style: str = DEFAULT_STYLE
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    replicas: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    threads: int | None = None
    max_batch_size: int = 8
    batch_wait_timeout_s: float = 0.1  # measured: docs/results/serve/batch-wait/
    request_timeout_s: float = 120.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    address: str | None = None
    cite_evidence: str | None = None  # the method whose evidence citations blend in (None: the answering pass's)
    api_key: str | None = None  # every route but /healthz and /readyz asks for `Authorization: Bearer <key>`
    # The work one request may ask for (serve.engine.Limits); each refused with a 400 naming its option.
    max_passages: int = Limits.max_passages
    max_prompt_tokens: int = Limits.max_prompt_tokens
    max_answer_tokens: int = Limits.max_answer_tokens
    max_restack_rounds: int = Limits.max_restack_rounds
    max_method_cost: float = Limits.max_method_cost
    # The cluster, the HTTP proxy and the replicas' load together; past it `start` fails naming the stage it was in.
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


class BodyLimit:
    """Refuse a body over the limit (413) before it is parsed: by its Content-Length when sent, else as it arrives."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = _LIMITS["max_body_bytes"]
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await self._refuse(int(length), limit, scope, receive, send)
            return
        # Without a Content-Length (chunked), read the body here, counting, and hand it on.
        messages, total = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            total += len(message.get("body", b""))
            if total > limit:
                await self._refuse(total, limit, scope, receive, send, at_least=True)
                return
            if not message.get("more_body"):
                break

        async def replay() -> dict:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(size: int, limit: int, scope, receive, send, at_least: bool = False) -> None:
        err = BodyTooLarge(
            f"the request body is {'over ' if at_least else ''}{size} bytes, more than this server's limit of "
            f"{limit} bytes (midlens serve --max-body-bytes); send fewer or shorter passages."
        )
        status, message, kind, code = describe(err)
        await error_response(status, message, kind, code)(scope, receive, send)


class ApiKey:
    """Refuse (401, OpenAI's error object) a request without this server's key, before anything else reads it.

    The key is what OpenAI clients send: `Authorization: Bearer <key>`; compared in constant time. Health checks
    stay open (a load balancer probes them without credentials)."""

    OPEN = ("/healthz", "/readyz")

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        key = _LIMITS.get("api_key")
        if scope["type"] != "http" or not key or scope.get("path") in self.OPEN:
            await self.app(scope, receive, send)
            return
        import hmac

        sent = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = sent.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode()):
            await self.app(scope, receive, send)
            return
        message = (
            "this server needs an API key: send `Authorization: Bearer <key>` (the openai client's api_key, "
            "RemoteMidlensLLM(api_key=...)); the key given was wrong or missing."
        )
        await error_response(401, message, "invalid_request_error", "invalid_api_key")(scope, receive, send)


# Set by the replica from its options; read by BodyLimit and ApiKey, which the ASGI stack builds without arguments.
_LIMITS: dict[str, Any] = {"max_body_bytes": DEFAULT_MAX_BODY_BYTES, "api_key": None}

api = FastAPI(
    title="midlens",
    description="Answers over stacked passages with per-passage evidence read from the model's own attention. "
    "OpenAI-compatible chat completions carry it in a `midlens` extension.",
    responses={400: {"model": ErrorResponse}, 413: {"model": ErrorResponse}, 504: {"model": ErrorResponse}},
)
api.add_middleware(BodyLimit)
api.add_middleware(ApiKey)  # added last, so it runs first: an unauthorised body is never read
api.add_exception_handler(RequestValidationError, on_invalid)
api.add_exception_handler(StarletteHTTPException, on_http_error)
# The library's refusals as 4xx; anything else as a 500 with its message (Starlette's last-resort handler).
for _refused in (MidlensError, ValueError, TypeError):
    api.add_exception_handler(_refused, on_error)
api.add_exception_handler(Exception, on_error)

_DONE = object()


def _sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


# Above the class: the deployment decorator pickles the class, with the functions it names, as it is defined.
def _error_body(err: BaseException) -> dict[str, Any]:
    _status, message, kind, code = describe(err)
    return {"error": {"message": message, "type": kind, "code": code}}


def _finish_reason(generated: int, max_new_tokens: int) -> str:
    return "length" if generated >= max_new_tokens else "stop"


def _usage(answer) -> dict[str, int]:
    return {
        "prompt_tokens": answer.prompt_tokens,
        "completion_tokens": answer.generated_tokens,
        "total_tokens": answer.prompt_tokens + answer.generated_tokens,
    }


def _replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 starts, in every replica, a gRPC server for calls between deployments on "[::]:0", every
    interface, with no option for the address. On a node whose own address is loopback (the cluster `start` makes)
    nothing off the machine could use it, so it is bound to 127.0.0.1, the address its callers are given."""
    import ipaddress

    import ray
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or not ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback:
        return

    def on_loopback(server: Any, address: str) -> int:
        return bind(server, "127.0.0.1:0" if address == "[::]:0" else address)

    replica.add_port_to_grpc_server = on_loopback


def _in_serve() -> bool:
    try:
        serve.get_replica_context()
    except Exception:  # noqa: BLE001 (outside a replica Ray raises; the class is then used directly)
        return False
    return True


@serve.deployment(name="MidlensServer")
@serve.ingress(api)
class MidlensServer:
    def __init__(self, options: dict[str, Any]) -> None:
        from midlens.generators.attention.evidence import EvidenceConfig
        from midlens.serve import app as this_module

        self.options = ServeOptions(**options)
        if _in_serve():  # before Serve starts the replica's gRPC server, which it does once this returns
            _replica_grpc_on_loopback()
        # The module's own dict (the class reaches the replica pickled, with copies of the globals it names).
        this_module._LIMITS["max_body_bytes"] = self.options.max_body_bytes
        this_module._LIMITS["api_key"] = self.options.api_key
        self.engine = Engine(
            self.options.model,
            self.options.method,
            self.options.device,
            self.options.dtype,
            EvidenceConfig.from_text(
                self.options.evidence_layers, self.options.evidence_query, self.options.evidence_heads
            ),
            self.options.prompt_style,
            self.options.max_new_tokens,
            self.options.threads,
            self.options.cite_evidence,
            Limits(**{f.name: getattr(self.options, f.name) for f in dataclasses.fields(Limits)}),
        )
        # One thread runs the model: a batch at a time, while the event loop stays free.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="midlens-generate")
        self._batch.set_max_batch_size(self.options.max_batch_size)
        self._batch.set_batch_wait_timeout_s(self.options.batch_wait_timeout_s)
        self.replica = serve.get_replica_context().replica_tag if _in_serve() else "local"

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.01)
    async def _batch(self, jobs: list[Job]) -> list[Outcome]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.engine.run, jobs)

    async def _answer(self, job: Job) -> Outcome:
        timeout = self.options.request_timeout_s
        try:
            outcome = await asyncio.wait_for(self._batch(job), timeout)
        except asyncio.TimeoutError:
            # Serve drops a cancelled request from batches not yet run, but a running batch decodes on: the flag
            # lets the engine stop this request's row at its next token (see Engine.run).
            job.cancel()
            raise RequestTimeout(self._timeout_message()) from None
        except asyncio.CancelledError:  # the client disconnected: Serve cancels the request's task
            job.cancel()
            raise
        if outcome.error is not None:
            raise outcome.error
        return outcome

    def _timeout_message(self) -> str:
        return (
            f"the request took more than {self.options.request_timeout_s:g} s, this server's request timeout "
            "(midlens serve --request-timeout); ask for fewer tokens or fewer passages."
        )

    # ---- midlens's own endpoints ----

    @api.post("/v1/midlens/answer", response_model=AnswerResponse)
    async def answer(self, body: AnswerRequest) -> JSONResponse:
        """Answer the question over the passages, in the order given; evidence per passage, by id."""
        outcome = await self._answer(self.engine.answer_job(body))
        answer = outcome.answer  # verified and withheld (abstaining) by the answer path, as the request asked
        return JSONResponse(
            {"question": answer.question, "text": answer.text, **result_of(answer, outcome.batch_size).model_dump()}
        )

    @api.post("/v1/midlens/score", response_model=MidlensResult)
    async def score(self, body: ScoreRequest) -> JSONResponse:
        """Evidence for the passages without generating (one prefill, plus the calibration suffix)."""
        outcome = await self._answer(self.engine.score_job(body))
        return JSONResponse(result_of(outcome.answer, outcome.batch_size).model_dump())

    @api.post("/v1/midlens/check", response_model=CheckResponse)
    async def check(self, body: CheckRequest) -> JSONResponse:
        """Cite an answer written elsewhere against the passages (in the order given), one teacher-forced pass, each
        citation verified by ablation unless `verify` is false; `unsupported` lists the sentences that may not be."""
        outcome = await self._answer(self.engine.check_job(body))
        answer = outcome.answer
        result = result_of(answer, outcome.batch_size).model_dump()
        doubts = flagged(answer)
        return JSONResponse(
            {
                "question": answer.question,
                "text": answer.text,
                **result,
                "unsupported": [c.span for c, _ in doubts],
                "unsupported_why": [why for _, why in doubts],
                "sentence_support": sentence_support(answer),
                "support_note": NO_SUPPORT_MODEL if answer.support is None else None,
            }
        )

    @api.get("/v1/midlens/spec", response_model=Spec)
    async def spec(self) -> Spec:
        o = self.options
        return Spec(
            **self.engine.spec(),
            max_batch_size=o.max_batch_size,
            batch_wait_timeout_s=o.batch_wait_timeout_s,
            request_timeout_s=o.request_timeout_s,
            max_body_bytes=o.max_body_bytes,
        )

    @api.get("/v1/midlens/stats", response_model=Stats)
    async def stats(self) -> Stats:
        return Stats(replica=self.replica, **self.engine.stats())

    @api.get("/healthz")
    async def healthz(self) -> dict[str, bool]:
        return {"ok": True}

    @api.get("/readyz")
    async def readyz(self) -> dict[str, Any]:
        # A replica answers only once its constructor (the model load) has finished: answering is being ready.
        return {"ready": True, "model": self.engine.model_name, "replica": self.replica}

    def check_health(self) -> None:
        """Ray Serve's periodic probe: a replica whose generation thread has died is restarted."""
        if self._pool._shutdown:  # noqa: SLF001 (the executor exposes no public flag)
            raise RuntimeError("the generation thread pool is shut down")

    # ---- OpenAI ----

    @api.get("/v1/models", response_model=ModelList)
    async def models(self) -> ModelList:
        return ModelList(data=[{"id": self.engine.model_name}])

    @api.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(self, body: ChatCompletionRequest):
        """OpenAI chat completions. Passages in `midlens.passages` are stacked under the last user message and
        scored; the response's `midlens` object holds the evidence (on the last streamed chunk when streaming)."""
        job = self.engine.chat_job(body)  # a bad request is refused here, before any event is sent
        marked = bool(body.midlens and body.midlens.marked)
        if marked and body.stream:
            raise InvalidArgumentError("midlens.marked writes markers into the whole answer: ask without stream.")
        withhold = bool(body.midlens and body.midlens.abstain)
        if withhold and body.stream:
            raise InvalidArgumentError(
                "midlens.abstain withholds an answer once its support is known, after its text: ask without stream "
                "(a stream's last chunk carries the support in midlens.support)."
            )
        if body.midlens and body.midlens.verify and body.stream:
            raise InvalidArgumentError(
                "midlens.verify checks the citations of the whole answer, after its text, and a stream sends each "
                "citation as its sentence ends: ask without stream."
            )
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        model = body.model or self.engine.model_name
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self._events(job, completion_id, model, created, include_usage), media_type="text/event-stream"
            )
        outcome = await self._answer(job)
        answer = outcome.answer
        max_new = job.decoding.max_new_tokens
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": marked_answer(answer).text if marked else answer.text,
                        },
                        "finish_reason": _finish_reason(answer.generated_tokens, max_new),
                        "logprobs": None,
                    }
                ],
                "usage": _usage(answer),
                "midlens": result_of(answer, outcome.batch_size).model_dump(),
            }
        )

    async def _events(
        self, job: Job, completion_id: str, model: str, created: int, include_usage: bool
    ) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        job.on_token = lambda piece: loop.call_soon_threadsafe(queue.put_nowait, piece)
        # One queue for both keeps a sentence's citation after the delta that began the next sentence.
        job.on_citation = lambda citation: loop.call_soon_threadsafe(queue.put_nowait, citation)
        task = asyncio.ensure_future(self._batch(job))
        # Deltas were queued from the generation thread before the batch returned, so they are read first.
        task.add_done_callback(lambda _task: queue.put_nowait(_DONE))
        head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return _sse(ChatCompletionChunk(**head, choices=[choice], **extra).model_dump(exclude_none=True))

        yield chunk({"role": "assistant", "content": ""})
        deadline = loop.time() + self.options.request_timeout_s
        raw, shown = "", ""  # deltas follow the stripped text, so they join to the non-streamed answer exactly
        try:
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), max(deadline - loop.time(), 0.0))
                except asyncio.TimeoutError:
                    job.cancel()
                    yield _sse(ErrorResponse(**_error_body(RequestTimeout(self._timeout_message()))).model_dump())
                    yield _sse("[DONE]")
                    return
                if item is _DONE:
                    break
                if isinstance(item, Citation):  # its span indexes the stripped text, all of which is shown
                    yield chunk({}, midlens_citation=citation_json(item))
                    continue
                raw += item
                text = raw.strip()
                if len(text) > len(shown) and text.startswith(shown):
                    yield chunk({"content": text[len(shown) :]})
                    shown = text
        finally:
            if not task.done():  # the client left mid-stream (the generator is closed): stop decoding for it
                job.cancel()
        try:
            outcome = task.result()
            if outcome.error is not None:
                raise outcome.error
        except Exception as err:  # noqa: BLE001 (sent as an error event: the status line has gone out already)
            yield _sse(ErrorResponse(**_error_body(err)).model_dump())
            yield _sse("[DONE]")
            return
        answer = outcome.answer
        rest = answer.text[len(shown) :] if answer.text.startswith(shown) else ""
        finish = _finish_reason(answer.generated_tokens, job.decoding.max_new_tokens)
        last = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": {"content": rest}, "finish_reason": finish, "logprobs": None}],
            "midlens": result_of(answer, outcome.batch_size).model_dump(),
        }
        yield _sse(last)
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(answer)})
        yield _sse("[DONE]")


def application(options: ServeOptions) -> serve.Application:
    """The deployment bound to its options: replicas, CPUs and GPUs per replica, concurrency for batching."""
    return MidlensServer.options(
        num_replicas=options.replicas,
        ray_actor_options={"num_cpus": options.num_cpus, "num_gpus": options.num_gpus},
        # Enough requests in flight per replica to fill a batch while another is generating.
        max_ongoing_requests=max(2 * options.max_batch_size, 16),
    ).bind(dataclasses.asdict(options))


# Ray swaps a loopback node address for the machine's own (so other nodes could join), and then binds its GCS,
# raylet, object manager, workers, agents and metrics exporters on every interface. With multi-node clusters
# turned off, as Ray has them on macOS and Windows, a loopback node address is kept and every one of those binds
# to it. Ray reads the switch from the environment once, at import; the processes ray.init starts read it again.
_RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextmanager
def _single_node_on_loopback() -> Iterator[None]:
    from ray._private import ray_constants

    saved_env, saved = os.environ.get(_RAY_CLUSTERS_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[_RAY_CLUSTERS_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        # Restored for this process: a later ray.init(address=...) from it must advertise a reachable address.
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(_RAY_CLUSTERS_ENV, None)
        else:
            os.environ[_RAY_CLUSTERS_ENV] = saved_env


# Every process of a cluster `start` makes carries its owner in the environment (inherited from ray.init): after a
# kill -9 of the owner, Ray's agents outlive it for a while; the next start finds them by this tag and ends them.
OWNER_ENV = "MIDLENS_SERVE_OWNER"


def _owner_tag(pid: int) -> str:
    import psutil

    return f"{pid}:{psutil.Process(pid).create_time():.3f}"


def reap_orphans() -> list[int]:
    """End the processes of local clusters whose `midlens serve` is gone (killed without a shutdown): those whose
    environment names an owner that no longer runs. Returns their pids. Other users' processes, and clusters
    started with --address, are never touched."""
    import psutil

    reaped = []
    for proc in psutil.process_iter(["pid"]):
        try:
            tag = proc.environ().get(OWNER_ENV)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
        if not tag or proc.pid == os.getpid():
            continue
        owner = int(tag.split(":")[0])
        try:
            alive = _owner_tag(owner) == tag
        except (psutil.NoSuchProcess, ValueError):
            alive = False
        if not alive:
            try:
                proc.kill()
                reaped.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
    return reaped


# Ray Serve's controller gives a new HTTP proxy 5 s to report ready and each health check 10 s, and kills a proxy
# that misses three in a row. With both cores of a two-core machine busy (another job's sweep), the proxy's start
# (its imports, uvicorn) took longer: 4 of 4 `midlens serve` starts ended in ActorDiedError before it had run. The
# controller reads these limits from its environment, which a cluster started here inherits from this process.
PROXY_CHECK_LIMITS = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
}


class ServeStartError(MidlensError):
    """The service did not come up; the message names the part that failed and the likely cause."""


def _busy_cores() -> str:
    load = os.getloadavg()[0]
    return f"load average {load:.1f} on {os.cpu_count()} cores"


class _StageTimeout(Exception):
    """A stage of `start` still running at the start's deadline."""


# Ray starts a cluster's processes with PR_SET_PDEATHSIG, which ties them to the thread that started them, not the
# process: a cluster started from a thread that ends is killed with it (GCS gone a minute later). So the thread that
# runs ray.init waits on this until `stop`.
_cluster_hold: threading.Event | None = None


def _within(deadline: float, call: Callable[[], Any], hold: threading.Event | None = None) -> Any:
    """`call()`'s result, or _StageTimeout once time.monotonic() passes `deadline`. Ray's calls that start a cluster,
    the proxy or an application take no timeout, so the call runs in a daemon thread, left behind on a timeout (the
    caller stops the service, and the process exits without waiting for it). With `hold` the thread outlives the
    call until `hold` is set."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 (raised again in the caller's thread)
            outcome["error"] = err
        finally:
            done.set()
        if hold is not None:
            hold.wait()

    threading.Thread(target=run, name="midlens-serve-start", daemon=True).start()
    if not done.wait(max(deadline - time.monotonic(), 0.0)):
        raise _StageTimeout
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


class _NotMainThreadWarning(logging.Filter):
    """ray.init warns that it sets no SIGTERM handler off the main thread; `start` sets the same one itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


@contextmanager
def _init_off_main_thread() -> Iterator[None]:
    if threading.current_thread() is threading.main_thread():
        # ray.init's own handler: SIGTERM exits through atexit, where Ray stops the processes it started.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
    quiet = _NotMainThreadWarning()
    logger = logging.getLogger("ray._private.worker")
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _replica_state(deadline_s: float = 10.0) -> str:
    """What Ray Serve says of the deployment (e.g. replicas not yet scheduled, or still initializing), or ''."""
    try:
        status = _within(time.monotonic() + deadline_s, serve.status)
        application = status.applications[APP_NAME]
        deployments = list(application.deployments.values())
        message = next((d.message for d in deployments if d.message), "") or application.message
    except Exception:  # noqa: BLE001 (a hint for the message only: a controller that does not answer gives none)
        return ""
    return f" Ray Serve says: {message.strip()}" if message and message.strip() else ""


def _runs_load_check(options: ServeOptions) -> bool:
    """Whether the replicas' load of a model already on this machine runs its one-time load check
    (generators/models/transformers_parity.py: a few forwards, several times a plain load on busy CPUs). Nothing is
    converted or loaded to find out; False when it cannot tell (a cluster elsewhere, a model not converted yet)."""
    if options.address:
        return False
    try:
        import torch

        from midlens.core.device import resolve_device, resolve_dtype
        from midlens.core.files import models_dir
        from midlens.generators.models.packaged_models import REGISTRY, canonical_name
        from midlens.generators.models.transformers_parity import is_recorded

        name = canonical_name(options.model)
        folder = models_dir() / name if name in REGISTRY else Path(name)
        if not (folder / "config.json").is_file():
            return False
        # A replica without GPUs sees none (Ray hides them), whatever this process sees.
        no_gpu = options.num_gpus == 0 and options.device == "auto"
        device = torch.device("cpu") if no_gpu else resolve_device(options.device)
        return not is_recorded(folder, resolve_dtype(options.dtype, device), device)
    except Exception:  # noqa: BLE001 (a hint for the message only)
        return False


def start(options: ServeOptions, progress: Callable[[str], None] | None = None) -> str:
    """Deploy on the cluster at `options.address`, else on a one-node cluster started here, every port of which
    listens on 127.0.0.1 but the HTTP proxy's, which listens on `options.host`; returns the base URL. Returns once
    every replica has loaded the model. `progress` hears what each stage waits for; a part of Ray that dies while
    starting, or a stage still running `options.start_timeout_s` after the start began, raises ServeStartError
    naming it and the machine's load (what had started is stopped first)."""
    import ray

    say = progress or (lambda _message: None)
    total = options.start_timeout_s
    deadline = time.monotonic() + total
    finished: list[str] = []  # "the Ray cluster 12 s", one per stage done
    stage, began, checking = "", time.monotonic(), False

    def enter(name: str) -> None:
        nonlocal stage, began
        if stage:
            finished.append(f"{stage} {_seconds(time.monotonic() - began)}")
        stage, began = name, time.monotonic()

    global _cluster_hold
    try:
        if not ray.is_initialized():
            _cluster_hold = hold = threading.Event()
            if options.address:
                say(f"connecting to the Ray cluster at {options.address}")
                enter("the Ray cluster")
                with _init_off_main_thread():
                    _within(deadline, lambda: ray.init(address=options.address, log_to_driver=False), hold)
            else:
                reap_orphans()  # a cluster an earlier `midlens serve` left when it was killed
                os.environ[OWNER_ENV] = _owner_tag(os.getpid())
                for name, value in PROXY_CHECK_LIMITS.items():
                    os.environ.setdefault(name, value)  # a value the caller set wins
                say("starting a one-node Ray cluster on 127.0.0.1")
                enter("the Ray cluster")
                with _single_node_on_loopback(), _init_off_main_thread():
                    _within(
                        deadline,
                        lambda: ray.init(
                            num_cpus=max(options.replicas * options.num_cpus, 1) + 1,
                            include_dashboard=False,
                            log_to_driver=False,
                            object_store_memory=256 * 2**20,
                            _node_ip_address="127.0.0.1",
                        ),
                        hold,
                    )
        ready_s = os.environ.get("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "5")
        say(f"starting Ray Serve's HTTP proxy on {options.host}:{options.port} (it has {ready_s} s to report ready)")
        enter("the HTTP proxy")
        http_options = {
            "host": options.host,
            "port": options.port,
            # The proxy's own limit is a backstop past the replica's, which answers with its own message first.
            "request_timeout_s": options.request_timeout_s + 30,
        }
        _within(deadline, lambda: serve.start(http_options=http_options))
        enter("the model's load")
        checking = _runs_load_check(options)
        check = " (its first load in this dtype here: it runs the one-time load check)" if checking else ""
        say(f"loading {options.model} in {options.replicas} replica(s){check}; ready once every one has loaded it")
        _within(deadline, lambda: serve.run(application(options), name=APP_NAME, route_prefix="/", blocking=False))
    except _StageTimeout:
        message = _timeout_message(options, stage, time.monotonic() - began, finished, checking)
        _stop_within(30.0)
        raise ServeStartError(message) from None
    except ray.exceptions.RayActorError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        stop()  # the half-started service and the cluster started for it
        raise ServeStartError(
            f"a part of Ray Serve died while the service started ({first}); {_busy_cores()}. A proxy or replica "
            "that cannot answer its health checks in time is killed: with every core busy, free one or raise "
            "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S / RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S (seconds; "
            f"`midlens serve` sets {', '.join(f'{k}={v}' for k, v in PROXY_CHECK_LIMITS.items())} for a cluster it "
            "starts; on --address set them where that cluster was started)."
        ) from err
    host = "127.0.0.1" if options.host in ("0.0.0.0", "::") else options.host
    return f"http://{host}:{options.port}"


def _timeout_message(options: ServeOptions, stage: str, spent: float, finished: list[str], checking: bool) -> str:
    where = f"{options.host}:{options.port}"
    what = {
        "the Ray cluster": (
            f"the Ray cluster at {options.address} did not answer"
            if options.address
            else "the one-node Ray cluster did not start"
        ),
        "the HTTP proxy": f"Ray Serve's HTTP proxy on {where} did not start",
        "the model's load": (
            f"the replica did not load {options.model}"
            if options.replicas == 1
            else f"the {options.replicas} replicas did not load {options.model}"
        ),
    }[stage]
    text = f"{what} within {_seconds(spent)} ({_busy_cores()}): the start is given {options.start_timeout_s:g} s in all"
    text += f" (--start-timeout), of which {', '.join(finished)} went before." if finished else " (--start-timeout)."
    if stage == "the model's load":
        text += _replica_state()
        if checking:
            text += (
                " This first load in this dtype runs the one-time comparison with transformers' forward, which a "
                f"later start reads from the cache: `midlens cache verify --model {options.model}` runs it beforehand."
            )
    return (
        f"{text} Every stage is slower with every core busy (another job's sweep): free a core, or allow longer "
        "with --start-timeout SECONDS."
    )


def _stop_within(seconds: float) -> None:
    """`stop()`, given up on after `seconds` (a controller that does not answer); the processes of a cluster started
    here go when this process exits, or at the next `midlens serve` (`reap_orphans`)."""
    try:
        _within(time.monotonic() + seconds, stop)
    except Exception:  # noqa: BLE001 (the timeout is what is reported)
        pass


def stop() -> None:
    """Tear the application down and, when this process started it, the local cluster."""
    import ray

    # Not before ray.init has returned (a start that timed out in it): serve.shutdown would start another cluster to
    # look for a controller in, and the processes the first one is still starting must keep their owner tag, by
    # which the next start ends those left (`reap_orphans`).
    if ray.is_initialized():
        serve.shutdown()
        ray.shutdown()
        os.environ.pop(OWNER_ENV, None)
    if _cluster_hold is not None:
        _cluster_hold.set()
