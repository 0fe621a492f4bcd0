"""An answer's wire form (generators.answering.answer_wire): written once, read back whole, and what the server sends
and the LlamaIndex responses carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from midlens.core.passage import Passage
from midlens.generators.answering.answer_wire import (
    ANSWER_KEYS,
    PASSAGE_KEYS,
    answer_from_wire,
    answer_to_wire,
    citation_from_wire,
    citation_to_wire,
)
from tests.tiny import save_tiny

QUESTION = "who directed the film ?"
WORDS = "the film was directed by zorbland in the city and the river pelican expedition was in 1990 ."
ROOT = Path(__file__).resolve().parent.parent


def _json(value):
    return json.loads(json.dumps(value))


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict:
    """Real answers of a tiny random Llama: one plain (citations, support); one restacked, with passages dropped by
    truncate="drop_last" and withheld for too little support. Each with the passages it was asked over."""
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker
    from midlens.generators.answering.support import abstain

    gen = Generator(str(save_tiny("llama", tmp_path_factory.mktemp("wire") / "m")), method="baseline", dtype="float32")
    few = [Passage(WORDS, "film", "a", 0.5), Passage("the secret code word is pelican .", "code", "b")]
    plain = gen.generate(gen.prompt(QUESTION, few), max_new_tokens=8)
    many = [Passage(WORDS, f"title {i}", f"p{i}", score=1.0 - i / 10) for i in range(6)]
    restacker = Restacker(gen, Restack("baseline", slots=(3, 1, 2, 4)))
    # 250 tokens kept for the answer leave room for 4 of the 6 passages in the tiny model's 512.
    restacked = restacker.generate(restacker.prompt(QUESTION, many, 250, truncate="drop_last"), max_new_tokens=8)
    assert abstain(restacked, below=1.0)  # withheld, whatever the support
    return {"plain": (plain, few), "restacked": (restacked, many)}


@pytest.mark.parametrize("name", ["plain", "restacked"])
def test_an_answer_round_trips_through_its_wire_form(answers, name):
    answer, passages = answers[name]
    wire = answer_to_wire(answer)
    assert tuple(wire) == ANSWER_KEYS
    assert all(tuple(row) == PASSAGE_KEYS for row in wire["passages"])
    assert _json(wire) == wire  # JSON-native: no tuples, nothing json.dumps refuses

    back = answer_from_wire(_json(wire), passages)
    assert answer_to_wire(back) == wire
    for field in ("question", "text", "model", "method", "evidence_config", "prompt_tokens", "generated_tokens"):
        assert getattr(back, field) == getattr(answer, field), field
    assert back.timings == answer.timings
    assert back.citations == answer.citations and back.support == answer.support
    assert back.restack == (None if answer.restack is None else _json(answer.restack))
    assert back.dropped == answer.dropped and not back.checked
    assert (back.withheld is None) == (answer.withheld is None)
    if answer.withheld is not None:
        assert back.withheld["text"] == answer.withheld["text"]
    for got, sent in zip(back.passages, answer.passages, strict=True):
        assert got.passage is passages[sent.position - 1]
        for field in ("position", "retrieval_score", "evidence", "calibrated", "answer_attribution", "rank", "score"):
            assert getattr(got, field) == getattr(sent, field), field


def test_the_exercised_answers_fill_every_wire_field(answers):
    """So the round trip above tests each field with a value, not only its None."""
    plain, _ = answers["plain"]
    restacked, _ = answers["restacked"]
    assert plain.citations and plain.support is not None and plain.restack is None and plain.withheld is None
    assert restacked.restack is not None and restacked.withheld is not None
    assert len(restacked.passages) == 4 and [p.id for p in restacked.dropped] == ["p4", "p5"]


def test_without_the_sent_passages_their_ids_and_titles_stand_in(answers):
    answer, _ = answers["restacked"]
    wire = answer_to_wire(answer)
    back = answer_from_wire(wire, question="asked", text="said", checked=True)
    assert (back.question, back.text, back.checked) == ("asked", "said", True)
    assert [(p.passage.id, p.passage.title, p.passage.text) for p in back.passages] == [
        (p.passage.id, p.passage.title, "") for p in answer.passages
    ]
    assert [p.id for p in back.dropped] == ["p4", "p5"]
    assert answer_to_wire(back) == {**wire, "question": "asked", "text": "said"}


def test_a_streamed_citation_reads_back_as_the_library_holds_it(answers):
    answer, _ = answers["plain"]
    for citation in answer.citations:
        assert citation_from_wire(_json(citation_to_wire(citation))) == citation


def test_the_server_sends_the_wire_form_and_its_schema_declares_it(answers):
    from midlens.rag.llamaindex.remote import answer_of
    from midlens.rag.remote import AnswerResponse, EvidenceRow, MidlensResult
    from midlens.serve.engine import citation_json, result_of

    assert tuple(EvidenceRow.model_fields) == PASSAGE_KEYS
    assert set(MidlensResult.model_fields) == set(ANSWER_KEYS) - {"question", "text"} | {"batch_size"}
    assert set(AnswerResponse.model_fields) == set(ANSWER_KEYS) | {"batch_size"}
    for name in answers:
        answer, passages = answers[name]
        wire = answer_to_wire(answer)
        sent = _json(result_of(answer, 2).model_dump())
        assert sent == {**{k: v for k, v in wire.items() if k not in ("question", "text")}, "batch_size": 2}
        reply = AnswerResponse.model_validate_json(json.dumps({**wire, "batch_size": 2}))  # as the client reads it
        assert answer_to_wire(answer_of(reply, reply.question, reply.text, passages)) == wire
        completion = MidlensResult.model_validate_json(json.dumps(sent))  # a chat completion's `midlens`
        assert answer_to_wire(answer_of(completion, answer.question, answer.text, passages)) == wire
        assert [_json(citation_json(c)) for c in answer.citations] == wire["citations"]


def test_llamaindex_responses_carry_the_wire_fields(answers):
    from midlens.rag.llamaindex.common import RESPONSE_KEYS, _response_kwargs, evidence_rows

    answer, _ = answers["restacked"]
    wire = answer_to_wire(answer)
    kwargs = _response_kwargs(answer)
    assert kwargs["answer"] is answer
    assert (
        kwargs["evidence"]
        == evidence_rows(answer)
        == [{k: v for k, v in row.items() if k != "score"} for row in wire["passages"]]
    )
    assert {key: kwargs[key] for key in RESPONSE_KEYS} == {key: wire[key] for key in RESPONSE_KEYS}


# What writing or reading the wire form by hand looks like: an evidence row's column as a dict key, the server's
# schema built field by field, citations rebuilt from JSON.
BY_HAND = re.compile(r'"answer_attribution":|\bEvidenceRow\(|\bMidlensResult\(|CitedSource\(\*\*|citations_from_json')


def test_no_other_module_writes_or_reads_the_wire_form_by_hand():
    wire = ROOT / "generators" / "answering" / "answer_wire.py"
    offenders = []
    for folder in ("core", "generators", "retrievers", "rag", "serve", "demo", "eval", "training", "midlens"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == wire:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if BY_HAND.search(line) and not line.lstrip().startswith("class "):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
