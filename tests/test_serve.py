"""`midlens serve` end to end: real Ray Serve on a local cluster, the real SmolLM2-135M, real HTTP on loopback.

One server for the module (Ray and the replica take ~45 s to start on two cores); the last tests cancel runaway
requests and then kill the replica, so they run last, in file order.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from midlens.core.errors import InvalidArgumentError, MidlensError, PromptTooLongError
from midlens.core.passage import Passage
from tests.conftest import PLANTED_FACT

pytestmark = [pytest.mark.slow, pytest.mark.model]

MAX_NEW = 8
TIMEOUT_S = 20.0  # generous: the machine running the tests may be shared
MAX_BODY = 256 * 1024
SOAK_ROUNDS = 5
SOAK_BOUND_S = TIMEOUT_S  # a valid request is answered within the server's own timeout, abuse or not
SOAK_RSS_GROWTH = 0.10  # the replica's memory after the last round, over the first: a leak per round would pass it
MAX_ANSWER = 4096  # tokens: the runaway requests below ask for 4000
MAX_PROMPT = 4000  # tokens: under SmolLM2's 8k window, so the server's own limit is what a longer prompt meets
ROOT = Path(__file__).resolve().parent.parent
PASSAGES = [
    {"id": "p1", "title": "Brea", "text": "Torrid opened its first store in Brea, California, in 1987."},
    {"id": "gold", "title": "Zorbland expedition", "text": PLANTED_FACT},
    {"id": "p3", "title": "Canal", "text": "The Whitewater Canal was built between 1836 and 1847 in Indiana."},
]
QUESTIONS = [
    "What is the secret code word of the Zorbland expedition?",
    "Where did Torrid open its first store?",
    "When was the Whitewater Canal built?",
    "Which state is the Whitewater Canal in?",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_cli(port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`midlens serve` in a process of its own, as an operator starts it (the packaged SmolLM2, baseline, one
    thread), with its stderr (where it says what it waits for) written to `log`."""
    command = [sys.executable, "-m", "midlens", "serve", "--model", "smollm2-135m", "--method", "baseline"]
    command += ["--port", str(port), "--threads", "1"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"))


@pytest.fixture(scope="module")
def server():
    from midlens.serve.app import ServeOptions, start, stop

    options = ServeOptions(
        model="smollm2-135m",
        method="baseline",  # the stock model, as the in-process `generator` fixture it is compared with
        port=_free_port(),
        max_new_tokens=MAX_NEW,
        threads=1,
        max_batch_size=8,
        batch_wait_timeout_s=0.05,
        request_timeout_s=TIMEOUT_S,
        max_body_bytes=MAX_BODY,
        max_prompt_tokens=MAX_PROMPT,
        max_answer_tokens=MAX_ANSWER,
    )
    url = start(options)
    try:
        yield url
    finally:
        stop()


@pytest.fixture(scope="module")
def client(server):
    from midlens.rag.remote import MidlensClient

    with MidlensClient(server, timeout=60, retries=4) as c:
        yield c


def _local(generator, question: str, passages=PASSAGES, max_new: int = MAX_NEW):
    prompt = generator.prompt(question, [Passage(p["text"], p["title"], p["id"]) for p in passages], max_new)
    return generator.generate(prompt, max_new_tokens=max_new)


def _same_evidence(rows: list, answer) -> None:
    rows = [row if isinstance(row, dict) else row.model_dump() for row in rows]  # OpenAI's extra field is a dict
    assert [r["id"] for r in rows] == [pe.passage.id for pe in answer.passages]
    for row, pe in zip(rows, answer.passages, strict=True):
        assert row["evidence"] == pytest.approx(pe.evidence, abs=1e-4)
        assert row["calibrated"] == pytest.approx(pe.calibrated, abs=1e-4)
        assert row["rank"] == pe.rank or abs(row["score"] - pe.score) < 1e-4


def test_concurrent_requests_are_batched_and_each_equals_its_answer_alone(client, generator):
    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(lambda q: client.answer(q, PASSAGES, max_new_tokens=MAX_NEW), QUESTIONS))
    for question, out in zip(QUESTIONS, served, strict=True):
        alone = _local(generator, question)
        assert out.text == alone.text
        _same_evidence(out.passages, alone)
        assert out.evidence == [r.score for r in out.passages]
        assert [c["span"] for c in out.citations] == [list(c.span) for c in alone.citations]
    assert max(out.batch_size for out in served) > 1, "four concurrent requests never shared a batch"
    stats = client.stats()
    assert sum(size * n for size, n in stats.batches.items()) == stats.requests


def test_openai_client_non_streaming_and_streaming(server, generator):
    from openai import OpenAI

    oai = OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    question = QUESTIONS[0]
    alone = _local(generator, question)
    messages = [{"role": "user", "content": question}]
    extra = {"midlens": {"passages": PASSAGES}}
    done = oai.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=MAX_NEW, extra_body=extra)
    assert done.choices[0].message.content == alone.text
    assert done.usage.completion_tokens == alone.generated_tokens
    _same_evidence(done.midlens["passages"], alone)

    stream = oai.chat.completions.create(
        model="smollm2-135m", messages=messages, max_tokens=MAX_NEW, extra_body=extra, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == alone.text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    _same_evidence(chunks[-1].midlens["passages"], alone)
    # Each answer sentence's citation in a chunk of its own (empty delta), before the final chunk repeats them all.
    cited = [c.midlens_citation for c in chunks if getattr(c, "midlens_citation", None) is not None]
    assert cited and cited == chunks[-1].midlens["citations"] == done.midlens["citations"]
    assert all(c.choices[0].delta.content in (None, "") for c in chunks if getattr(c, "midlens_citation", None))


def test_openai_like_llm_chats_as_in_process(server, generator):
    from llama_index.core.base.llms.types import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    from midlens.generators.models.prompt import chat_prompt

    llm = OpenAILike(
        model="smollm2-135m",
        api_base=server + "/v1",
        api_key="unused",
        is_chat_model=True,
        max_tokens=MAX_NEW,
        temperature=0.0,
        max_retries=0,
    )
    reply = llm.chat([ChatMessage(role="user", content="Name a colour.")])
    turns = [{"role": "user", "content": "Name a colour."}]
    prompt = chat_prompt(generator.tokenizer, turns, generator.context_window - MAX_NEW)
    alone = generator.generate(prompt, max_new_tokens=MAX_NEW, calibrate=False)
    assert reply.message.content == alone.text
    assert reply.raw.midlens["passages"] == []  # the extension reaches LlamaIndex's raw response (no passages)


def test_midlens_llm_with_a_base_url_answers_as_in_process(server, loaded):
    from llama_index.core.schema import NodeWithScore, TextNode

    from midlens.rag.llamaindex import MidlensLLM

    nodes = [
        NodeWithScore(node=TextNode(id_=p["id"], text=p["text"], metadata={"title": p["title"]}), score=0.5)
        for p in PASSAGES
    ]
    remote = MidlensLLM.from_server(server, max_new_tokens=MAX_NEW)
    local = MidlensLLM(loaded, method="baseline", max_new_tokens=MAX_NEW)
    assert isinstance(remote, MidlensLLM) and remote.model == "smollm2-135m"
    from midlens.core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=r"MidlensLLM.from_server\(base_url"):
        MidlensLLM(base_url=server)  # the factory builds the remote one, not a constructor that returns another class
    with ThreadPoolExecutor(4) as pool:
        served = list(pool.map(lambda q: remote.complete(q, passages=nodes), QUESTIONS))
    for question, out in zip(QUESTIONS, served, strict=True):
        mine = local.complete(question, passages=nodes)
        assert out.text == mine.text
        for a, b in zip(out.additional_kwargs["evidence"], mine.additional_kwargs["evidence"], strict=True):
            assert a["id"] == b["id"] and a["calibrated"] == pytest.approx(b["calibrated"], abs=1e-4)
    chunks = list(remote.stream_complete(QUESTIONS[0], passages=nodes))
    assert "".join(c.delta or "" for c in chunks) == served[0].text
    assert chunks[-1].additional_kwargs["answer"].passages[1].passage.id == "gold"
    cited = [c.additional_kwargs["citation"] for c in chunks if "citation" in c.additional_kwargs]
    assert cited and cited == chunks[-1].additional_kwargs["answer"].citations  # as a local stream hands them
    local_chunks = list(local.stream_complete(QUESTIONS[0], passages=nodes))
    assert [c.additional_kwargs["citation"].span for c in local_chunks if "citation" in c.additional_kwargs] == [
        c.span for c in cited
    ]


def test_a_served_llm_marks_the_citations_a_template_asks_for_as_in_process(server, loaded):
    """Defect: a server-backed MidlensLLM read LlamaIndex's "Source N:" citation template back into passages but
    dropped the "[n]" markers it asks for (a local MidlensLLM writes them): the stock CitationQueryEngine showed no
    citations through a server. Now the same markers as in process, streamed or not (the deltas join into it)."""
    import re

    from llama_index.core import get_response_synthesizer
    from llama_index.core.query_engine import CitationQueryEngine
    from llama_index.core.query_engine.citation_query_engine import CITATION_QA_TEMPLATE, CITATION_REFINE_TEMPLATE

    from midlens.rag.llamaindex import MidlensLLM

    remote = MidlensLLM.from_server(server, max_new_tokens=MAX_NEW)
    local = MidlensLLM(loaded, method="baseline", max_new_tokens=MAX_NEW)
    served, mine = (CitationQueryEngine(_fixed_retriever(), llm=llm).query(QUESTIONS[0]) for llm in (remote, local))
    assert re.search(r"\[\d\]", mine.response), mine.response  # a question whose answer cites: markers to carry
    assert served.response == mine.response
    synthesizer = get_response_synthesizer(
        llm=remote, text_qa_template=CITATION_QA_TEMPLATE, refine_template=CITATION_REFINE_TEMPLATE, streaming=True
    )
    streamed = CitationQueryEngine(_fixed_retriever(), llm=remote, response_synthesizer=synthesizer)
    assert "".join(streamed.query(QUESTIONS[0]).response_gen) == mine.response


def test_a_served_llm_reads_a_stock_chat_qa_template_as_in_process(server, loaded):
    """Defect: through a server, LlamaIndex's chat QA template (its system turn, then the context and query) went
    whole to the server's chat template: no passages, no evidence (in process it is read back into one passage per
    context chunk). Now the same answer and passages as in process, streamed or not."""
    from llama_index.core.prompts.chat_prompts import CHAT_TEXT_QA_PROMPT

    from midlens.rag.llamaindex import MidlensLLM

    remote = MidlensLLM.from_server(server, max_new_tokens=MAX_NEW)
    local = MidlensLLM(loaded, method="baseline", max_new_tokens=MAX_NEW)
    context = "\n\n".join(f"title: {p['title']}\n\n{p['text']}" for p in PASSAGES)
    messages = CHAT_TEXT_QA_PROMPT.format_messages(context_str=context, query_str=QUESTIONS[0])
    served, mine = (llm.chat(messages) for llm in (remote, local))
    theirs, ours = (r.additional_kwargs["answer"] for r in (served, mine))
    assert len(ours.passages) == len(PASSAGES) and ours.question == QUESTIONS[0]
    assert served.message.content == mine.message.content and theirs.question == ours.question
    assert [pe.passage.text for pe in theirs.passages] == [pe.passage.text for pe in ours.passages]
    assert [pe.calibrated for pe in theirs.passages] == pytest.approx([pe.calibrated for pe in ours.passages], abs=1e-4)
    streamed = list(remote.stream_chat(messages))
    assert "".join(c.delta or "" for c in streamed) == mine.message.content
    assert len(streamed[-1].additional_kwargs["answer"].passages) == len(PASSAGES)
    # The message LlamaIndex keeps carries the support, from a server as in process (issue 83 H).
    for message in (served.message, streamed[-1].message):
        support = message.additional_kwargs["support"]["probability"]
        assert support == pytest.approx(mine.message.additional_kwargs["support"]["probability"], abs=1e-4)


def test_a_served_llm_completes_a_condense_prompt_as_a_rewrite_as_in_process(server, loaded):
    """A chat engine's condense prompt sent to a server is completed as in process (issue 83 G): in the model's
    chat template, by the plain model whatever method answers, no passages; streamed or not."""
    from llama_index.core.chat_engine.condense_plus_context import DEFAULT_CONDENSE_PROMPT_TEMPLATE

    from midlens.rag.llamaindex import MidlensLLM

    remote = MidlensLLM.from_server(server, method="finetuned", max_new_tokens=MAX_NEW)
    local = MidlensLLM(loaded, method="baseline", max_new_tokens=MAX_NEW)
    history = "user: Who designed the Kessler Bridge?\nassistant: Oskar Lindqvist [1]."
    prompt = DEFAULT_CONDENSE_PROMPT_TEMPLATE.format(chat_history=history, question="When did it open?")
    served, mine = remote.complete(prompt), local.complete(prompt)
    assert served.text == mine.text and served.additional_kwargs["answer"].passages == []
    assert mine.additional_kwargs["answer"].method["name"] == "baseline"
    assert "".join(c.delta or "" for c in remote.stream_complete(prompt)) == mine.text


def test_restacked_requests_are_answered_as_restacked_in_process(server, client, loaded, generator):
    from midlens.generators.answering.restack import Restack, Restacker
    from midlens.rag.llamaindex import MidlensLLM, MidlensQueryEngine

    passages = [Passage(p["text"], p["title"], p["id"]) for p in PASSAGES]
    alone = Restacker(generator, Restack("baseline")).generate(
        generator.prompt(QUESTIONS[0], passages, MAX_NEW), max_new_tokens=MAX_NEW
    )
    assert alone.restack["order"] != [1, 2, 3], "the planted fact should move: nothing here would show a restack"
    out = client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW, restack="baseline")
    assert out.text == alone.text and out.restack["order"] == alone.restack["order"]
    assert [row.id for row in out.passages] == ["p1", "gold", "p3"]  # positions as the caller gave them
    _same_evidence(out.passages, alone)
    done = client.chat(
        [{"role": "user", "content": QUESTIONS[0]}],
        max_tokens=MAX_NEW,
        midlens={"passages": PASSAGES, "restack": "baseline"},
    )
    assert done.choices[0].message.content == alone.text and done.midlens.restack["order"] == alone.restack["order"]
    # The support travels with every response: the client's Answer holds the server's, as computed in process.
    assert done.midlens.support["probability"] == pytest.approx(alone.support.probability, abs=1e-4)
    assert out.support["likely"] == alone.support.likely
    # LlamaIndex through the server: the LLM's restack option and the query engine's travel as request fields.
    remote = MidlensLLM.from_server(server, max_new_tokens=MAX_NEW)
    completion = remote.complete(QUESTIONS[0], passages=_nodes(), restack="baseline")
    assert completion.text == alone.text
    assert completion.additional_kwargs["answer"].restack["order"] == alone.restack["order"]
    chunks = list(remote.stream_complete(QUESTIONS[0], passages=_nodes(), restack="baseline"))
    assert "".join(c.delta or "" for c in chunks) == alone.text
    engine = MidlensQueryEngine(retriever=_fixed_retriever(), llm=remote, restack="baseline")
    response = engine.query(QUESTIONS[0])
    assert str(response) == alone.text and response.metadata["midlens"]["restack"]["order"] == alone.restack["order"]
    with pytest.raises(InvalidArgumentError, match="not sent to a server"):
        remote.complete(QUESTIONS[0], passages=_nodes(), restack=Restack("baseline", slots=(3, 2, 1)))
    # Refused with the library's message: a scorer that is no method, and restacking a chat that has no passages.
    bad = _post(server, "/v1/midlens/answer", json.dumps({"question": "hi", "passages": PASSAGES, "restack": "nope"}))
    assert bad.status_code == 400 and "restacking scores the passages with a method's evidence" in bad.text
    chat = {"messages": [{"role": "user", "content": "hi"}], "midlens": {"restack": "baseline"}}
    bad = _post(server, "/v1/chat/completions", json.dumps(chat))
    assert bad.status_code == 400 and "this conversation has none" in bad.text
    # By default a request restacks where that was measured to help the model and method (core.defaults.
    # MEASURED_RESTACKS: none passes out of domain today, SmolLM2's `finetuned` included); a named scorer restacks
    # in the answering method's own measured slots; `restack: null` answers in the order given, also from LlamaIndex.
    plain = client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW)
    assert plain.restack is None and plain.method["name"] == "baseline"
    assert client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW, method="finetuned").restack is None
    tuned = client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW, method="finetuned", restack="mudaf")
    assert tuned.restack["scorer"] == "mudaf" and tuned.restack["slot_order"] == "smollm2-135m.finetuned.json"
    as_given = client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW, method="finetuned", restack=None)
    assert as_given.restack is None
    as_given = MidlensLLM.from_server(server, method="finetuned", max_new_tokens=MAX_NEW, restack=None)
    assert as_given.complete(QUESTIONS[0], passages=_nodes()).additional_kwargs["answer"].restack is None
    assert MidlensQueryEngine(retriever=_fixed_retriever(), llm=remote, restack=None)._call() == {"restack": None}


def _fixed_retriever():
    """A LlamaIndex retriever that returns PASSAGES' nodes for any question."""
    from llama_index.core.retrievers import BaseRetriever

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return _nodes()

    return Fixed()


def _nodes() -> list:
    """PASSAGES as retrieved LlamaIndex nodes, new ones each time (a reranker writes scores and metadata on them)."""
    from llama_index.core.schema import NodeWithScore, TextNode

    return [
        NodeWithScore(node=TextNode(id_=p["id"], text=p["text"], metadata={"title": p["title"]}), score=0.9 - i / 10)
        for i, p in enumerate(PASSAGES)
    ]


def _rerank(reranker, question: str) -> tuple[list, list]:
    """The reranker's output on `_nodes()`, and what LlamaIndex saw of it: the rerank events (instrumentation) and
    the RERANKING callback pairs."""
    from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent

    events: list = []

    class Recorder(BaseEventHandler):
        def handle(self, event, **kwargs) -> None:
            if isinstance(event, ReRankStartEvent):
                events.append(("start", event.model_name, event.top_n, [n.node.node_id for n in event.nodes]))
            elif isinstance(event, ReRankEndEvent):
                events.append(("end", [n.node.node_id for n in event.nodes]))

    nodes = _nodes()
    debug = LlamaDebugHandler()
    reranker.callback_manager = CallbackManager([debug])
    recorder, root = Recorder(), get_dispatcher()
    root.add_event_handler(recorder)
    try:
        out = reranker.postprocess_nodes(nodes, query_str=question)
    finally:
        root.event_handlers.remove(recorder)
    return out, [*events, ("callback pairs", len(debug.get_event_pairs(CBEventType.RERANKING)))]


def _same_reranking(served: list, local: list) -> None:
    assert [n.node.node_id for n in served] == [n.node.node_id for n in local]
    assert [n.score for n in served] == pytest.approx([n.score for n in local], abs=1e-4)
    assert [n.node.metadata for n in served] == [n.node.metadata for n in local]


def test_attention_reranker_with_a_base_url_reranks_as_in_process(server, loaded, generator):
    from midlens.core.errors import InvalidArgumentError
    from midlens.rag.llamaindex import AttentionReranker
    from midlens.rag.remote import ServerUnreachable

    question = QUESTIONS[0]
    served = AttentionReranker(base_url=server, top_n=2, keep_retrieval_score=True)
    local = AttentionReranker(model=loaded, top_n=2, keep_retrieval_score=True)
    # Not named: the best ranker measured for the model (core.defaults.RERANKERS), on the server as here.
    assert (served.model, served.method) == (local.model, local.method) == ("smollm2-135m", "mudaf")
    out, seen = _rerank(served, question)
    local_out, local_seen = _rerank(local, question)
    _same_reranking(out, local_out)
    assert len(out) == 2 and out[0].node.node_id == "gold"
    top = [next(p for p in PASSAGES if p["id"] == n.node.node_id) for n in out]
    assert seen == local_seen and seen[0][:3] == ("start", "smollm2-135m/mudaf", 2) and len(seen) == 3

    # Nodes over one pass: the server fits the passes as fit_windows does here; raw evidence, as asked.
    whole = local.generator.prompt(question, [Passage(p["text"], p["title"], p["id"]) for p in PASSAGES], 0)
    options = {"top_n": 3, "score_by": "evidence", "max_tokens_per_pass": whole.num_tokens * 2 // 3}
    out, _ = _rerank(AttentionReranker(base_url=server, **options), question)
    _same_reranking(out, _rerank(AttentionReranker(model=loaded, **options), question)[0])
    passes = {n.node.metadata["rerank_passes"] for n in out}
    assert len(passes) == 1 and passes.pop() >= 2

    # In a query engine whose LLM is served too: nothing is loaded here for either.
    from llama_index.core.retrievers import BaseRetriever

    from midlens.generators.models import loading
    from midlens.rag.llamaindex import MidlensLLM, MidlensQueryEngine

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return _nodes()

    in_memory = set(loading._LOADED)
    engine = MidlensQueryEngine(
        retriever=Fixed(), llm=MidlensLLM.from_server(server, max_new_tokens=MAX_NEW), node_postprocessors=[served]
    )
    response = engine.query(question)
    assert response.response == _local(generator, question, top).text  # the served reranker's two, in its order
    assert set(loading._LOADED) == in_memory

    with pytest.raises(InvalidArgumentError, match="not both"):
        AttentionReranker(model="smollm2-135m", base_url=server)
    with pytest.raises(InvalidArgumentError, match="device= is the server's to choose"):
        AttentionReranker(base_url=server, device="cpu")
    nobody = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(ServerUnreachable, match=f"no answer from a midlens server at {nobody} \\(ConnectError") as dead:
        AttentionReranker(base_url=nobody, retries=0)
    assert dead.value.__cause__ is None and dead.value.__suppress_context__  # no httpx traceback under it


def test_score_spec_health_and_openapi(server, client, generator):
    question = QUESTIONS[0]
    scored = client.score(question, PASSAGES)
    prompt = generator.prompt(question, [Passage(p["text"], p["title"], p["id"]) for p in PASSAGES], MAX_NEW)
    _same_evidence(scored.passages, generator.score(prompt))
    assert scored.generated_tokens == 0
    spec = client.spec()
    assert spec.model == "smollm2-135m" and spec.method_spec == "baseline" and spec.restack is None
    assert spec.max_body_bytes == MAX_BODY and spec.request_timeout_s == TIMEOUT_S
    assert httpx.get(server + "/healthz").json() == {"ok": True}
    assert httpx.get(server + "/readyz").json()["ready"] is True
    paths = httpx.get(server + "/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/midlens/answer", "/v1/midlens/score", "/v1/midlens/spec"} <= set(paths)
    assert httpx.get(server + "/docs").status_code == 200


def _post(server: str, path: str, content: bytes | str) -> httpx.Response:
    return httpx.post(server + path, content=content, headers={"content-type": "application/json"}, timeout=60)


def code_of(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_each_error_has_a_stable_openai_style_code_and_type():
    """Defect (issue 83 O): an error's `code` was the Python class that raised it ("ValueError", "TooMuchWork"),
    which changes with the code base and means nothing to an OpenAI client. Each case has a code of its own now,
    OpenAI's where it has one, and its type."""
    from midlens.core.errors import MethodConfigError, RetrievalIndexError
    from midlens.serve.engine import ArtefactRefused, Cancelled, ModelNotServed, TooMuchWork
    from midlens.serve.errors import CODES, BodyTooLarge, RequestTimeout, describe

    cases = [
        (PromptTooLongError(9000, 8000), 400, "invalid_request_error", "context_length_exceeded"),
        (
            TooMuchWork("the prompt is over", code="context_length_exceeded"),
            400,
            "invalid_request_error",
            "context_length_exceeded",
        ),
        (TooMuchWork("65 passages"), 400, "invalid_request_error", "limit_exceeded"),
        (ModelNotServed("gpt-4"), 404, "invalid_request_error", "model_not_found"),
        (MethodConfigError("no-such-method"), 400, "invalid_request_error", "invalid_method"),
        (ArtefactRefused("a folder"), 400, "invalid_request_error", "artefact_not_allowed"),
        (InvalidArgumentError("empty"), 400, "invalid_request_error", "invalid_request"),
        (RetrievalIndexError("damaged"), 400, "invalid_request_error", "invalid_request"),
        (ValueError("bad"), 400, "invalid_request_error", "invalid_request"),
        (TypeError("bad"), 400, "invalid_request_error", "invalid_request"),
        (BodyTooLarge("big"), 413, "invalid_request_error", "body_too_large"),
        (RequestTimeout("slow"), 504, "timeout", "request_timeout"),
        (Cancelled("stopped"), 504, "timeout", "request_cancelled"),
        (RuntimeError("boom"), 500, "server_error", "server_error"),
    ]
    for err, status, kind, code in cases:
        got_status, _, got_kind, got_code = describe(err)
        assert (got_status, got_kind, got_code) == (status, kind, code), err
        assert code in CODES and code != type(err).__name__


def test_bad_requests_are_4xx_with_the_library_s_message(server, generator):
    from midlens.generators.methods.registry import method_config
    from midlens.serve.engine import HTTP_REMEDIES

    def refused(response: httpx.Response, status: int) -> str:
        assert response.status_code == status, response.text
        assert "Traceback" not in response.text
        return response.json()["error"]["message"]

    chat = "/v1/chat/completions"
    assert "not valid JSON" in refused(_post(server, chat, '{"messages": ['), 400)
    empty = _post(server, chat, '{"messages": []}')
    assert refused(empty, 400) == "the conversation is empty: pass at least one message with text."
    assert code_of(empty) == "invalid_request"  # OpenAI-style codes, never a Python class name ("ValueError")
    with pytest.raises(MidlensError) as unknown:
        method_config("no-such-method")
    body = {"messages": [{"role": "user", "content": "hi"}], "model": "smollm2-135m/no-such-method"}
    response = _post(server, chat, json.dumps(body))
    assert refused(response, 400) == str(unknown.value) and code_of(response) == "invalid_method"
    body = {"question": "hi", "passages": [], "method": "no-such-method"}
    assert refused(_post(server, "/v1/midlens/answer", json.dumps(body)), 400) == str(unknown.value)
    response = _post(
        server, chat, json.dumps({**body, "model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]})
    )
    assert "not served here" in refused(response, 404) and code_of(response) == "model_not_found"

    # A request never reaches the disk: any artefact path, existing or not, folder or not, gets the same words.
    from midlens.serve.engine import ARTEFACT_REFUSED

    for path in ("/root", "/nonexistent", str(Path(__file__).parent)):
        body = {"question": "hi", "passages": [], "method": f"mudaf(artefact='{path}')"}
        response = _post(server, "/v1/midlens/answer", json.dumps(body))
        assert refused(response, 400) == ARTEFACT_REFUSED and code_of(response) == "artefact_not_allowed"
        chat_body = {"messages": [{"role": "user", "content": "hi"}], "model": f"smollm2-135m/{body['method']}"}
        assert refused(_post(server, chat, json.dumps(chat_body)), 400) == ARTEFACT_REFUSED

    long = [{"id": "long", "text": "lorem ipsum " * 5000}]  # ~10k tokens, over the 8k window, under the body limit
    with pytest.raises(PromptTooLongError) as too_long:
        generator.prompt("What is it?", [Passage(long[0]["text"], "", "long")], MAX_NEW)
    response = _post(server, "/v1/midlens/answer", json.dumps({"question": "What is it?", "passages": long}))
    assert refused(response, 400) == too_long.value.describe(HTTP_REMEDIES)
    assert response.json()["error"]["code"] == "context_length_exceeded"

    huge = json.dumps({"question": "hi", "passages": [{"id": "x", "text": "a" * (MAX_BODY + 1)}]})
    response = _post(server, "/v1/midlens/answer", huge)
    assert f"limit of {MAX_BODY} bytes" in refused(response, 413) and code_of(response) == "body_too_large"
    assert "question" in refused(_post(server, "/v1/midlens/answer", "{}"), 400)
    with pytest.raises(MidlensError) as empty:
        generator.prompt(" ", [], MAX_NEW)
    assert refused(_post(server, "/v1/midlens/answer", json.dumps({"question": " "})), 400) == str(empty.value)


def test_requests_over_the_limits_and_out_of_openai_s_ranges_are_refused_before_any_work(server, client):
    def refused(response: httpx.Response, status: int) -> dict:
        assert response.status_code == status, response.text
        return response.json()["error"]  # OpenAI's error object on every path

    before = client.stats().requests
    answer = "/v1/midlens/answer"
    many = [{"id": str(i), "text": "a passage"} for i in range(65)]
    over = refused(_post(server, answer, json.dumps({"question": "q", "passages": many})), 400)
    assert "takes at most 64" in over["message"] and over["code"] == "limit_exceeded"
    body = {"question": "q", "passages": [], "max_new_tokens": MAX_ANSWER + 1}
    assert f"limit of {MAX_ANSWER}" in refused(_post(server, answer, json.dumps(body)), 400)["message"]
    bases = [10000.0 * (1 + i / 10) for i in range(20)]
    body = {"question": "q", "passages": [], "method": f"attention-buckets(bases={bases})"}
    assert "costs about 20 plain answers" in refused(_post(server, answer, json.dumps(body)), 400)["message"]
    body = {"question": "q", "passages": [{"id": "a", "text": "x"}], "restack": "mudaf", "restack_rounds": 4}
    assert "limit of 3" in refused(_post(server, answer, json.dumps(body)), 400)["message"]
    long = [{"id": "l", "text": "lorem ipsum dolor " * 640}]  # ~4.5k tokens: under the window, over the limit
    error = refused(_post(server, answer, json.dumps({"question": "q", "passages": long})), 400)
    assert f"limit of {MAX_PROMPT}" in error["message"] and "--max-prompt-tokens" in error["message"]
    assert error["code"] == "context_length_exceeded"  # too long for this server, as a prompt over the window is

    chat = "/v1/chat/completions"
    hi = [{"role": "user", "content": "hi"}]
    assert refused(_post(server, chat, json.dumps({"messages": hi, "temperature": 5})), 400)["param"] == "temperature"
    assert refused(_post(server, chat, json.dumps({"messages": hi, "max_tokens": "5"})), 400)["param"] == "max_tokens"
    assert client.stats().requests == before  # none of them reached the model

    missing = refused(httpx.post(server + "/v1/completions", json={"prompt": "hi"}, timeout=30), 404)
    assert missing["code"] == "not_found" and "/v1/chat/completions" in missing["message"]
    assert refused(httpx.get(server + chat, timeout=30), 405)["code"] == "method_not_allowed"
    wrong = httpx.post(server + chat, content=b"hi", headers={"content-type": "text/plain"}, timeout=30)
    assert "must be a JSON object" in refused(wrong, 400)["message"]


def test_marked_content_shows_the_citations_to_a_stock_client(server, generator):
    from midlens.rag.pipeline import marked_answer

    question = QUESTIONS[0]
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_NEW,
        "midlens": {"passages": PASSAGES, "marked": True, "restack": None},
    }
    response = _post(server, "/v1/chat/completions", json.dumps(body))
    assert response.status_code == 200, response.text
    local = _local(generator, question)
    assert local.citations  # the in-process answer cites: the markers have something to show
    assert response.json()["choices"][0]["message"]["content"] == marked_answer(local).text
    streamed = _post(server, "/v1/chat/completions", json.dumps({**body, "stream": True}))
    assert streamed.status_code == 400 and "without stream" in streamed.json()["error"]["message"]


def test_abstain_withholds_an_unsupported_answer_and_says_so(server, generator):
    """`midlens.abstain`: the answer the server would give, unless its support is under the model's threshold:
    then the content says so and `midlens.withheld` holds the answer (the same decision as in process)."""
    from midlens.generators.answering.support import ABSTAIN_TEXT

    question = QUESTIONS[0]
    local = _local(generator, question)
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_NEW,
        "midlens": {"passages": PASSAGES, "abstain": True, "restack": None},
    }
    response = _post(server, "/v1/chat/completions", json.dumps(body))
    assert response.status_code == 200, response.text
    got = response.json()
    content, midlens = got["choices"][0]["message"]["content"], got["midlens"]
    assert midlens["support"]["likely"] is local.support.likely
    if local.support.likely:
        assert content == local.text and midlens["withheld"] is None
    else:
        assert content == ABSTAIN_TEXT and midlens["withheld"] == local.text and not midlens["citations"]
    streamed = _post(server, "/v1/chat/completions", json.dumps({**body, "stream": True}))
    assert streamed.status_code == 400 and "midlens.abstain" in streamed.json()["error"]["message"]


def _replica_rss_mb() -> float:
    import psutil

    replicas = [p for p in psutil.Process().children(recursive=True) if "MidlensServer" in " ".join(p.cmdline() or [])]
    assert replicas, "no replica process found"
    return sum(p.memory_info().rss for p in replicas) / 2**20


def test_soak_mixed_valid_and_abusive_requests(server, client):
    """Bounded rounds of valid requests sent together with abusive ones (too many passages, a costly method, an
    artefact path, broken JSON, an oversized body): every valid request is answered 200 within SOAK_BOUND_S, every
    abusive one 4xx, and the replica's resident memory grows by less than SOAK_RSS_GROWTH over the rounds (one
    process; after the first round, which warms the allocator)."""
    answer = "/v1/midlens/answer"
    valid = json.dumps({"question": QUESTIONS[1], "passages": PASSAGES, "max_new_tokens": MAX_NEW, "restack": None})
    abusive = [
        json.dumps({"question": "q", "passages": [{"id": str(i), "text": "x"} for i in range(500)]}),
        json.dumps(
            {"question": "q", "passages": [], "method": f"attention-buckets(bases={[1e4 + i for i in range(200)]})"}
        ),
        json.dumps({"question": "q", "passages": [], "method": "mudaf(artefact='/root')"}),
        '{"question": "q", "passages": [',
        json.dumps({"question": "q", "passages": [{"id": "x", "text": "a" * (MAX_BODY + 1)}]}),
    ]
    codes: dict[int, int] = {}
    latencies, rss = [], []

    def send(body: str) -> tuple[bool, int, float]:
        t0 = time.monotonic()
        response = _post(server, answer, body)
        return body == valid, response.status_code, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(SOAK_ROUNDS):
            for is_valid, status, seconds in pool.map(send, [valid, *abusive, valid]):
                codes[status] = codes.get(status, 0) + 1
                if is_valid:
                    assert status == 200
                    latencies.append(seconds)
                else:
                    assert 400 <= status < 500
            rss.append(_replica_rss_mb())
    print(f"soak: {SOAK_ROUNDS} rounds, codes {codes}, valid latency max {max(latencies):.2f} s, RSS MB {rss}")
    assert max(latencies) < SOAK_BOUND_S
    assert rss[-1] < rss[0] * (1 + SOAK_RSS_GROWTH)


def test_a_server_killed_hard_leaves_nothing_after_the_next_start_s_cleanup(tmp_path):
    """kill -9 of `midlens serve` leaves Ray's agents running for a while; the next start (`reap_orphans`, which
    `start` calls first) ends every process of the dead server's cluster."""
    import psutil

    from midlens.serve.app import OWNER_ENV, reap_orphans

    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
    cli = _serve_cli(port, env, tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert cli.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            time.sleep(2)
        tag = f"{cli.pid}:"

        def tagged() -> list[int]:
            found = []
            for proc in psutil.process_iter(["pid"]):
                try:
                    if proc.environ().get(OWNER_ENV, "").startswith(tag):
                        found.append(proc.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            return found

        assert len(tagged()) > 3  # the CLI, and the cluster it started: GCS, raylet, agents, workers
        cli.send_signal(signal.SIGKILL)
        cli.wait(10)
        # Read at once: Ray's processes notice their owner's death on their own within about 2 s (sometimes), and
        # what the next start must end is what is still there when it runs.
        left = tagged()
        assert left, "nothing outlived the kill: the cleanup would have nothing to do"
        reaped = set(reap_orphans())

        def gone(pid: int) -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        # Each left-over process is ended by the cleanup, unless it ended on its own in between.
        assert all(pid in reaped or gone(pid) for pid in left), (left, reaped)
        deadline = time.monotonic() + 10
        while tagged() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not tagged()
    finally:
        if cli.poll() is None:
            cli.kill()


def test_the_server_listens_on_loopback_only(server):
    """Every socket the server's processes listen on (the HTTP proxy, and Ray's GCS, raylet, object manager,
    workers, agents and metrics exporters: all started by this process, so all in its process tree) is bound to
    a loopback address."""
    import psutil

    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    listening = set()
    for process in processes:
        try:
            connections = process.net_connections("inet")
            name = process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        listening |= {(name, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
    names = {name for name, _ip, _port in listening}
    assert {"gcs_server", "raylet"} <= names, f"Ray's own processes were not found listening: {sorted(names)}"
    port = int(server.rsplit(":", 1)[1])
    assert any(p == port for _name, _ip, p in listening), "the HTTP proxy was not found listening"
    exposed = sorted((name, ip, p) for name, ip, p in listening if not _loopback(ip))
    assert not exposed, f"listening beyond loopback: {exposed}"


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    # gRPC's dual-stack sockets report IPv4 loopback as ::ffff:127.0.0.1.
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def test_the_library_does_not_import_the_service():
    """midlens.serve is a shell: nothing below it imports it, MidlensLLM.from_server(...) included, which reaches a
    server through midlens.rag.remote (the client and the wire format the service imports too)."""
    offenders = []
    for folder in ("core", "generators", "retrievers", "rag", "training", "eval", "demo"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    continue
                offenders += [f"{path.relative_to(ROOT)}:{m}" for m in modules if m.startswith("midlens.serve")]
    assert not offenders
    for light in (ROOT / "rag" / "remote.py", ROOT / "rag" / "llamaindex" / "remote.py", ROOT / "serve" / "engine.py"):
        source = light.read_text(encoding="utf-8")
        assert "import ray" not in source and "from ray" not in source and "fastapi" not in source, light
    remote = (ROOT / "rag" / "remote.py").read_text(encoding="utf-8")
    assert "llama_index" not in remote and "torch" not in remote  # a client needs neither
    # The LLM's served side imports nothing back from the LLM module, not even in a function, so no circle can hide
    # there. The LLM imports it only where a served call needs it: the served side loads torch-side types, and
    # `from llama_index.llms.midlens import MidlensLLM` must not (test_llamaindex's light-import test).
    served = ROOT / "rag" / "llamaindex" / "remote.py"
    assert "midlens.rag.llamaindex.llm" not in served.read_text(encoding="utf-8")
    llm = ast.parse((ROOT / "rag" / "llamaindex" / "llm.py").read_text(encoding="utf-8"))
    assert not [n for n in llm.body if isinstance(n, ast.ImportFrom) and n.module == "midlens.rag.llamaindex.remote"]


def test_a_request_cancelled_mid_batch_stops_while_the_live_one_answers_as_alone(generator):
    """The engine the replica runs, on the real model, without Ray: a request whose client leaves while it shares a
    running batch with a live one stops at its next token; the live one decodes on to the answer it gets alone."""
    from midlens.rag.remote import AnswerRequest
    from midlens.serve.engine import Cancelled, Engine, result_of

    limit = 16
    # The model the fixtures loaded (one per process), run as the stock model the other tests compare with.
    engine = Engine("smollm2-135m", method="baseline", max_new_tokens=MAX_NEW)
    live = engine.answer_job(AnswerRequest(question=QUESTIONS[0], passages=PASSAGES, max_new_tokens=limit))
    leaving = engine.answer_job(AnswerRequest(question=QUESTIONS[2], passages=PASSAGES, max_new_tokens=limit))
    assert live.decoding == leaving.decoding  # one group: one generate_batch with both rows
    streamed: list[str] = []

    def leave_after_two(piece: str) -> None:
        streamed.append(piece)
        if len(streamed) == 2:
            leaving.cancel()  # what the replica does when the client disconnects or the request times out

    leaving.on_token = leave_after_two
    answered, cancelled = engine.run([live, leaving])
    alone = _local(generator, QUESTIONS[0], max_new=limit)
    assert answered.error is None and answered.batch_size == 2
    assert answered.answer.text == alone.text and answered.answer.generated_tokens == alone.generated_tokens
    _same_evidence(result_of(answered.answer, 2).passages, alone)
    assert _local(generator, QUESTIONS[2], max_new=limit).generated_tokens > 2  # alone it would have gone on
    assert isinstance(cancelled.error, Cancelled) and cancelled.answer is None
    assert cancelled.error.generated_tokens == 2 < limit and len(streamed) == 2
    assert engine.stats()["cancelled"] == 1

    # Every request of the batch cancelled: decoding stops for all, each is told so, and each is counted.
    both = [
        engine.answer_job(AnswerRequest(question=q, passages=PASSAGES, max_new_tokens=limit)) for q in QUESTIONS[:2]
    ]

    def all_leave(_piece: str) -> None:
        for job in both:
            job.cancel()

    both[0].on_token = all_leave
    outcomes = engine.run(both)
    assert all(isinstance(o.error, Cancelled) and o.answer is None for o in outcomes)
    assert engine.stats()["cancelled"] == 3


def test_a_server_citing_with_another_methods_evidence_cites_as_in_process(loaded):
    """`midlens serve --cite-evidence mudaf`: the engine's answers cite what the in-process generator with
    `MeasuredCitations(evidence_from="mudaf")` cites (same passages, same sentences), and its spec says so."""
    from midlens.generators import Generator
    from midlens.generators.answering.citations import MeasuredCitations
    from midlens.rag.remote import AnswerRequest
    from midlens.serve.engine import Engine

    engine = Engine("smollm2-135m", method="baseline", max_new_tokens=MAX_NEW, cite_evidence="mudaf")
    assert engine.spec()["cite_evidence"] == "mudaf"
    job = engine.answer_job(AnswerRequest(question=QUESTIONS[0], passages=PASSAGES, max_new_tokens=16))
    (outcome,) = engine.run([job])
    local = Generator(loaded, method="baseline", citations=MeasuredCitations(evidence_from="mudaf"))
    alone = _local(local, QUESTIONS[0], max_new=16)
    assert outcome.error is None and outcome.answer.text == alone.text and alone.citations
    served = [[(s.position, s.sentence) for s in c.sources] for c in outcome.answer.citations]
    assert served == [[(s.position, s.sentence) for s in c.sources] for c in alone.citations]
    assert outcome.answer.timings["cite_evidence_s"] > 0  # the scorer's prefill ran
    with pytest.raises(MidlensError, match="cite_evidence"):
        Engine("smollm2-135m", method="baseline", cite_evidence="mudaff")


def test_serve_refuses_a_misspelt_cite_evidence_before_ray_starts(capsys):
    from midlens.cli import main

    assert main(["serve", "--model", "smollm2-135m", "--cite-evidence", "mudaff"]) == 2
    assert "--cite-evidence mudaff" in capsys.readouterr().err


# Sampled at a high temperature the answer rarely ends early: far more tokens than any timeout here allows.
RUNAWAY = {"max_new_tokens": 4000, "temperature": 2.0, "seed": 1}


def _stopped(client, count: int) -> bool:
    """Whether the replica has stopped decoding `count` cancelled requests (at their next token: seconds)."""
    deadline = time.monotonic() + 30
    while client.stats().cancelled < count and time.monotonic() < deadline:
        time.sleep(0.5)
    return client.stats().cancelled == count


def test_a_client_that_leaves_cancels_its_request(server, client):
    cancelled = client.stats().cancelled
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(server + "/v1/midlens/answer", json={"question": "Write a long story.", **RUNAWAY}, timeout=3.0)
    assert _stopped(client, cancelled + 1)
    chat = {
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": RUNAWAY["max_new_tokens"],
        "temperature": RUNAWAY["temperature"],
        "seed": RUNAWAY["seed"],
        "stream": True,
    }
    with httpx.stream("POST", server + "/v1/chat/completions", json=chat, timeout=60) as response:
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        next(events), next(events)  # the role, then the first words: the stream is running; then it is closed
    assert _stopped(client, cancelled + 2)


def test_a_request_over_the_timeout_is_answered_504_and_its_decoding_stops(server, client):
    cancelled = client.stats().cancelled
    t0 = time.monotonic()
    response = _post(server, "/v1/midlens/answer", json.dumps({"question": "Write a long story.", **RUNAWAY}))
    assert response.status_code == 504, response.text
    assert "request timeout" in response.json()["error"]["message"]
    assert time.monotonic() - t0 < TIMEOUT_S + 5
    # The replica stops decoding the abandoned answer at its next token instead of running to 4000 tokens.
    assert _stopped(client, cancelled + 1)
    t0 = time.monotonic()
    assert client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW).text
    assert time.monotonic() - t0 < TIMEOUT_S, "the next request waited behind the timed-out one"


def test_a_replica_killed_mid_request_does_not_hang_the_client(server, client):
    """The replica is killed while a request waits on it: the client gets its answer from the restarted replica,
    or a clear error, within a bounded time."""
    from midlens.rag.remote import ServerError

    pid = client.stats().pid
    outcome: dict = {}

    def ask() -> None:
        try:
            outcome["answer"] = client.answer(QUESTIONS[0], PASSAGES, max_new_tokens=MAX_NEW)
        except (ServerError, httpx.HTTPError) as err:
            outcome["error"] = err

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    assert not thread.is_alive(), "the client hung on a killed replica"
    if "error" in outcome:
        assert str(outcome["error"])  # a message, not a hang
    else:
        assert outcome["answer"].text
    deadline = time.monotonic() + 90
    while not client.ready() and time.monotonic() < deadline:  # Serve restarts the replica
        time.sleep(1.0)
    assert client.stats().pid != pid


def test_lm_eval_harness_local_chat_completions_answers_as_in_process(server, loaded, tmp_path):
    """The harness's own OpenAI-compatible model (`local-chat-completions`) against this server, on midlens's
    position-controlled task: the server reads midlens's RAG prompt back into its passages, honours the harness's
    `stop` (a line break), and answers each question as the harness's in-process `--model midlens` does."""
    import lm_eval
    from lm_eval.api.instance import Instance
    from lm_eval.tasks import TaskManager

    from midlens.eval.harness import TASKS, MidlensLM

    tasks = TaskManager(include_path=str(TASKS), metadata={"position": 3})
    args = f"model=smollm2-135m,base_url={server}/v1/chat/completions,num_concurrent=1,max_retries=1"
    out = lm_eval.simple_evaluate(
        model="local-chat-completions",
        model_args=args,
        tasks=["midlens_mdqa"],
        task_manager=tasks,
        limit=2,
        apply_chat_template=True,
        log_samples=True,
    )
    samples = out["samples"]["midlens_mdqa"]
    assert len(samples) == 2
    local = MidlensLM(loaded, method="baseline", device="cpu")
    for sample in samples:
        context = sample["doc"]["prompt"]
        request = Instance("generate_until", sample["doc"], (context, {"until": ["\n"], "max_gen_toks": 16}), 0)
        (expected,) = local.generate_until([request], disable_tqdm=True)
        assert sample["filtered_resps"][0].strip() == expected.strip() != ""


def test_a_helmet_style_item_through_the_openai_client_answers_as_in_process(server, generator):
    """HELMET's OpenAI-compatible model class is the OpenAI client's chat completion (messages, temperature 0,
    top_p, max_tokens, stop). A HELMET-style position-controlled RAG item (its template, built from local
    passages: its data sets cannot be downloaded here), sent as HELMET sends it, stop at the line end: the server
    answers it in the model's chat template as the in-process generator does, cut before the stop."""
    from openai import OpenAI

    from midlens.generators.models.prompt import chat_prompt

    documents = "\n\n".join(f"Document (Title: {p['title']}): {p['text']}" for p in PASSAGES)
    item = (
        "Use the given documents to write a concise and short answer to the question. Write your answer in the "
        f"following format:\nAnswer: [answer]\n\n{documents}\n\nQuestion: {QUESTIONS[0]}\nAnswer:"
    )
    oai = OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    done = oai.chat.completions.create(
        model="smollm2-135m",
        messages=[{"role": "user", "content": item}],
        temperature=0.0,
        top_p=1.0,
        max_tokens=16,
        stop=["\n"],
    )
    turns = [{"role": "user", "content": item}]
    prompt = chat_prompt(generator.tokenizer, turns, generator.context_window - 16)
    alone = generator.generate(prompt, max_new_tokens=16, calibrate=False, stop_at_line_end=True)
    expected = alone.text.split("\n")[0].rstrip()
    assert done.choices[0].message.content == expected != ""
    assert "\n" not in done.choices[0].message.content


@pytest.mark.busy
def test_serve_becomes_ready_with_every_core_kept_busy(tmp_path):
    """Issue 74 G: with both cores busy (two CPU-bound processes, as when a sweep runs beside it) Ray Serve's proxy
    missed its 5 s ready check three times and was killed: `midlens serve` died with ActorDiedError, 4 of 4 tries.
    Here the cores are kept busy for the test's whole run (one busy loop per core) and the server must answer
    /readyz, its stderr saying what it waited for at each stage."""
    from midlens.generators.models.loading import load_model
    from midlens.serve.app import OWNER_ENV, PROXY_CHECK_LIMITS

    # The first load of a model in a dtype runs the one-time check against transformers (minutes in bf16 on two
    # busy cores) and records it; done here first, the replica reads the record, and what is timed below is the
    # start the issue is about: Ray's cluster, Serve's proxy and the replica's load.
    load_model("smollm2-135m")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, os.cpu_count() or 2))]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV and k not in PROXY_CHECK_LIMITS}
    log = tmp_path / "serve.log"
    cli = _serve_cli(port, env, log)
    try:
        # Issue 83 P: ready within --start-timeout's default 180 s, or the CLI exits naming the stage that ran past it
        # (the log shown below says which); 60 s more for that exit. 3-4 min were measured before, both cores busy.
        deadline, ready = time.monotonic() + 240, False
        while time.monotonic() < deadline and not ready and cli.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code == 200
            except httpx.TransportError:
                time.sleep(3)
        said = log.read_text()
        if not ready:  # the other outcome the issue allows: a clear exit naming the stage past the deadline
            assert cli.wait(timeout=60) == 2, said[-3000:]
            assert re.search(r"(cluster|proxy|replica)[^\n]* within [0-9.]+ s \(load average", said), said[-3000:]
            assert "ActorDiedError" not in said  # issue 74 G's death stays fixed
            return
        assert "starting Ray Serve's HTTP proxy" in said and "(it has 60 s to report ready)" in said
        assert "loading smollm2-135m in 1 replica(s)" in said
    finally:
        cli.send_signal(signal.SIGTERM)
        try:
            cli.wait(timeout=120)
        except subprocess.TimeoutExpired:
            cli.kill()
        for proc in busy:
            proc.kill()
            proc.wait()


def _hung_stage(monkeypatch, stage: str) -> tuple[threading.Event, list[bool]]:
    """Ray's start with `stage` ("cluster", "proxy" or "replica") never returning and the others instant, as on
    a machine whose cores are all busy; the event lets the hung call go at the end, the list hears `stop`."""
    import ray

    from midlens.serve import app

    release, stopped = threading.Event(), []

    def call(name: str):
        return (lambda *_args, **_kwargs: release.wait(60)) if name == stage else (lambda *_args, **_kwargs: None)

    for name, value in {app.OWNER_ENV: "", **app.PROXY_CHECK_LIMITS}.items():
        monkeypatch.setenv(name, value)  # `start` sets them; put back after
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", call("cluster"))
    monkeypatch.setattr(app.serve, "start", call("proxy"))
    monkeypatch.setattr(app.serve, "run", call("replica"))
    monkeypatch.setattr(app.serve, "status", lambda: None)  # no deployment to describe
    monkeypatch.setattr(app, "reap_orphans", lambda: [])
    monkeypatch.setattr(app, "_runs_load_check", lambda _options: True)
    monkeypatch.setattr(app, "stop", lambda: stopped.append(True))
    return release, stopped


@pytest.mark.parametrize(
    ("stage", "named", "before"),
    [
        ("cluster", "the one-node Ray cluster did not start within 0.5 s (load average ", ""),
        ("proxy", "Ray Serve's HTTP proxy on 127.0.0.1:", "of which the Ray cluster "),
        ("replica", "the replica did not load smollm2-135m within 0.5 s (load average ", "the HTTP proxy "),
    ],
)
def test_a_stage_still_running_at_the_start_timeout_fails_naming_it(monkeypatch, stage, named, before):
    """Issue 83 P: with both cores busy `/readyz` was not 200 after 185 s, and nothing said which stage was slow.
    A stage still running when --start-timeout runs out (here 0.5 s) fails the start at once, naming that stage,
    the load, what went before and how to allow longer, and the half-started service is stopped."""
    from midlens.serve import app

    release, stopped = _hung_stage(monkeypatch, stage)
    try:
        began = time.monotonic()
        with pytest.raises(app.ServeStartError) as caught:
            app.start(app.ServeOptions(model="smollm2-135m", port=_free_port(), start_timeout_s=0.5))
        assert time.monotonic() - began < 10
    finally:
        release.set()
    message = str(caught.value)
    assert message.startswith(named), message
    assert "the start is given 0.5 s in all (--start-timeout)" in message and before in message
    assert "allow longer with --start-timeout SECONDS" in message and stopped == [True]
    if stage == "replica":  # its load ran the one-time check: said, with how to run it beforehand
        assert "`midlens cache verify --model smollm2-135m` runs it beforehand" in message


def test_the_cli_fails_quickly_with_the_stage_past_its_start_timeout(monkeypatch, capsys):
    from midlens.cli import main

    release, _stopped = _hung_stage(monkeypatch, "replica")
    try:
        began = time.monotonic()
        argv = ["serve", "--model", "smollm2-135m", "--method", "baseline", "--port", str(_free_port())]
        assert main([*argv, "--start-timeout", "0.5"]) != 0
        assert time.monotonic() - began < 10
    finally:
        release.set()
    err = capsys.readouterr().err
    assert "midlens: error: the replica did not load smollm2-135m within 0.5 s (load average " in err, err
    assert main([*argv, "--start-timeout", "0"]) == 2
    assert "--start-timeout 0: give the start some seconds (> 0)." in capsys.readouterr().err


def test_a_part_of_ray_that_dies_while_starting_is_named_with_the_cause(monkeypatch):
    """Where the proxy still dies (a cluster started elsewhere, with Ray's 5 s limits), `start` says which part died,
    the machine's load and what to change, instead of Ray's ActorDiedError from inside `serve.start`."""
    import ray
    import ray.exceptions

    from midlens.serve import app

    def died(**_kwargs):
        raise ray.exceptions.ActorDiedError()

    stopped = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(app.serve, "start", died)
    monkeypatch.setattr(app, "stop", lambda: stopped.append(True))
    heard = []
    with pytest.raises(app.ServeStartError) as caught:
        app.start(app.ServeOptions(model="smollm2-135m", port=_free_port()), progress=heard.append)
    message = str(caught.value)
    assert "a part of Ray Serve died while the service started (The actor died unexpectedly" in message
    assert "load average" in message and "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S" in message
    assert stopped == [True] and heard and heard[0].startswith("starting Ray Serve's HTTP proxy")
