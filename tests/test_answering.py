"""One answer path (rag.answering): Pipeline, the eval plan and the server's engine answer a question over the same
passages with the same options alike, and the server verifies and abstains through that path, as Pipeline does.

Real parts: the packaged SmolLM2-135M in fp32 and the dense retriever over a four-paragraph corpus."""

from __future__ import annotations

import json

import pytest

MAX_NEW = 8
TOP_K = 3
CORPUS = [
    ("Wings of Desire", "Wings of Desire is a 1987 romantic fantasy film directed by Wim Wenders."),
    ("Wim Wenders", "Wim Wenders is a German filmmaker, playwright, author and photographer, born in Dusseldorf."),
    ("Brea Mall", "Brea Mall is a shopping mall in Brea, California, opened in 1977 and owned by Simon Property."),
    ("Berlin", "Berlin is the capital and largest city of Germany, with about 3.8 million inhabitants."),
]
QUESTION = "Who directed Wings of Desire?"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from midlens.retrievers.build import build_retriever

    folder = tmp_path_factory.mktemp("answering")
    corpus, questions = folder / "corpus.jsonl", folder / "questions.jsonl"
    corpus.write_text("".join(json.dumps({"id": t, "title": t, "text": x}) + "\n" for t, x in CORPUS))
    questions.write_text(json.dumps({"id": "q1", "question": QUESTION, "answers": ["Wim Wenders"]}) + "\n")
    return corpus, questions, build_retriever(corpus, "dense", folder / "index")


def _record(answer) -> dict:
    """An answer as compared: everything but its timings (wall time differs run to run) and its passages' metadata
    (the retriever's own; a request's passages carry none)."""
    out = answer.to_dict()
    out.pop("timings")
    for row in out["passages"]:
        row["passage"].pop("metadata")
    return out


def _request(passages, **fields):
    from midlens.rag.remote import AnswerRequest

    sent = [{"id": p.id, "title": p.title, "text": p.text, "score": p.score} for p in passages]
    return AnswerRequest(question=QUESTION, passages=sent, max_new_tokens=MAX_NEW, **fields)


@pytest.fixture(scope="module")
def engine(loaded):
    from midlens.serve.engine import Engine

    # dtype named: the in-process answers compared with are fp32 (the `loaded` fixture), as this engine's weights.
    return Engine("smollm2-135m", method="baseline", max_new_tokens=MAX_NEW, dtype="float32")


@pytest.fixture(scope="module")
def passages(corpus):
    return corpus[2].search(QUESTION, TOP_K)


@pytest.fixture(scope="module")
def pipe(generator):
    from midlens.rag.pipeline import Pipeline

    return Pipeline(None, generator, top_k=TOP_K, max_new_tokens=MAX_NEW, restack=None)


@pytest.fixture(scope="module")
def served_verified(engine, passages):
    (outcome,) = engine.run([engine.answer_job(_request(passages, restack=None, verify=True))])
    assert outcome.error is None
    return outcome.answer


def test_pipeline_eval_plan_and_server_give_the_same_answer(generator, corpus, engine, passages, tmp_path):
    """One option set (the stock model, passages in retrieval order, 8 new tokens) through the three interfaces:
    the same text from all three, and the same citations, evidence and support from Pipeline and the server (the
    eval plan's rows keep the text and the titles retrieved)."""
    from midlens.eval.options import RunOptions
    from midlens.eval.plan import build_run
    from midlens.rag.pipeline import Pipeline

    corpus_path, questions, retriever = corpus
    piped = Pipeline(retriever, generator, top_k=TOP_K, max_new_tokens=MAX_NEW, restack=None).ask(QUESTION)
    assert piped.text.strip() and piped.citations  # an answer with citations: there is something to compare

    (served,) = engine.run([engine.answer_job(_request(passages, restack=None))])
    assert served.error is None
    assert _record(served.answer) == _record(piped)

    run = build_run(
        RunOptions(
            mode="e2e",
            out=tmp_path / "run",
            methods=("baseline",),
            model="smollm2-135m",
            dtype="float32",
            questions=questions,
            corpus=corpus_path,
            index_dir=tmp_path / "index",
            retrieval="dense",
            top_k=TOP_K,
            max_new_tokens=MAX_NEW,
            progress=False,
        )
    )
    (unit,) = run.plan.units
    row = run.evaluate(unit)
    assert row["prediction"] == piped.text
    assert row["retrieved"] == [pe.passage.title for pe in piped.passages]


def test_the_server_verifies_and_abstains_through_the_answer_path(pipe, engine, passages, served_verified):
    """`verify` on the server: each citation checked by ablation, as Pipeline checks it (same drops, same support).
    `abstain` at a threshold above any probability withholds the answer in the engine itself (no handler step),
    keeping it in `withheld`; at 0 nothing is withheld."""
    from midlens.generators.answering.support import ABSTAIN_TEXT
    from midlens.serve.engine import result_of

    verified = pipe.answer(QUESTION, passages, verify=True)
    sources = [s for c in verified.citations for s in c.sources]
    assert sources and all(s.verified is not None for s in sources)
    assert _record(served_verified) == _record(verified)
    assert result_of(served_verified, 1).citations[0]["sources"][0]["verified"] is not None

    withheld, kept = engine.run(
        [
            engine.answer_job(_request(passages, restack=None, abstain=True, abstain_below=1.0)),
            engine.answer_job(_request(passages, restack=None, abstain=True, abstain_below=0.0)),
        ]
    )
    assert withheld.batch_size == 1 and kept.batch_size == 1  # different abstaining: answered as separate groups
    assert withheld.answer.text == ABSTAIN_TEXT and not withheld.answer.citations
    assert withheld.answer.withheld["text"] == verified.text and withheld.answer.support.threshold == 1.0
    assert kept.answer.text == verified.text and kept.answer.withheld is None
    in_process = pipe.answer(QUESTION, passages, abstain=True, abstain_below=1.0)
    assert _record(withheld.answer) == _record(in_process)


def test_the_chat_extension_verifies_and_refuses_verify_without_passages(engine, passages, served_verified):
    """`midlens.verify` in a chat completion: the answer over `midlens.passages` verified as `/v1/midlens/answer`
    verifies it; without passages there is nothing to verify, and the request is refused with what to send."""
    from midlens.core.errors import InvalidArgumentError
    from midlens.serve.schemas import ChatCompletionRequest

    sent = [{"id": p.id, "title": p.title, "text": p.text, "score": p.score} for p in passages]
    chat = ChatCompletionRequest(
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=MAX_NEW,
        midlens={"passages": sent, "restack": None, "verify": True},
    )
    (chatted,) = engine.run([engine.chat_job(chat)])
    assert chatted.error is None and _record(chatted.answer) == _record(served_verified)
    bare = ChatCompletionRequest(messages=[{"role": "user", "content": QUESTION}], midlens={"verify": True})
    with pytest.raises(InvalidArgumentError, match="midlens.passages"):
        engine.chat_job(bare)
