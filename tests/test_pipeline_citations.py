"""Citations through Pipeline: ask, ask_many (each row equal to its question alone), verification, streaming, and
the inline markers, on the real SmolLM2-135M."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from midlens.core.errors import InvalidArgumentError
from midlens.generators import Generator
from midlens.generators.answering.citations import Citation, CitedSource
from midlens.rag.pipeline import AnswerStream, Pipeline, marked_answer
from tests.conftest import planted_passages

QUESTIONS = [
    "In what California city was the first Torrid location opened?",
    "Which canal was built between 1836 and 1847, Washington City Canal or Whitewater Canal?",
]
PLANTED_QUESTION = "What is the secret code word of the Zorbland expedition?"
TOL = 1e-4  # batched rows equal rows alone up to summation order


def citation_shape(answer) -> list:
    return [(c.span, [(s.position, s.passage_id, s.sentence) for s in c.sources]) for c in answer.citations]


def test_ask_many_rows_equal_each_question_alone_citations_included(pipeline):
    batch = pipeline.ask_many(QUESTIONS, batch_size=2, max_new_tokens=10)
    for question, row in zip(QUESTIONS, batch, strict=True):
        alone = pipeline.ask(question, max_new_tokens=10)
        assert row.text == alone.text
        assert row.citations and any(c.sources for c in row.citations)
        assert citation_shape(row) == citation_shape(alone)
        for a, b in zip(alone.citations, row.citations, strict=True):
            assert all(abs(x.score - y.score) < TOL for x, y in zip(a.sources, b.sources, strict=True))
        for citation in row.citations:
            start, end = citation.span
            assert row.text[start:end].strip() == row.text[start:end] != ""
            for source in citation.sources:  # the marker number is the passage's prompt position
                passage = row.passages[source.position - 1]
                assert passage.position == source.position and passage.passage.id == source.passage_id


def test_verify_checks_every_citation_in_ask_ask_many_and_answer(pipeline):
    passages = planted_passages(6, 3)  # tests/test_citations.py's planted answer: its first sentence rests on gold
    answer = pipeline.answer(PLANTED_QUESTION, passages, max_new_tokens=24, verify=True)
    sources = [s for c in answer.citations for s in c.sources]
    assert sources and all(isinstance(s.verified, bool) and s.logprob_drop is not None for s in sources)
    assert all(s.verified == (s.logprob_drop >= pipeline.generator.citations.margin) for s in sources)
    assert "verify_s" in answer.timings
    top = answer.citations[0].sources[0]
    assert top.passage_id == "gold" and top.position == 3 and top.verified is True

    unchecked = pipeline.answer(PLANTED_QUESTION, passages, max_new_tokens=24)
    assert citation_shape(unchecked) == citation_shape(answer)  # verification only fills in verified/logprob_drop
    assert all(s.verified is None for c in unchecked.citations for s in c.sources)
    again = pipeline.verify([unchecked])[0]  # an Answer alone: its prompt rebuilt from the passages it stacked
    for a, b in zip(answer.citations, again.citations, strict=True):
        for x, y in zip(a.sources, b.sources, strict=True):
            assert x.verified == y.verified and abs(x.logprob_drop - y.logprob_drop) < 1e-3

    [asked] = pipeline.ask_many(QUESTIONS[:1], max_new_tokens=8, verify=True)
    assert all(isinstance(s.verified, bool) for c in asked.citations for s in c.sources)


def test_a_stream_carries_the_citations_after_its_text(pipeline):
    passages = planted_passages(4, 3)
    stream = pipeline.answer_stream(PLANTED_QUESTION, passages, max_new_tokens=12, verify=True)
    assert isinstance(stream, AnswerStream) and stream.answer is None
    events = list(stream.events())
    texts = [e for e in events if isinstance(e, str)]
    citations = [e for e in events if isinstance(e, Citation)]
    assert events == texts + citations  # all the text first, then one Citation per answer sentence, in order
    answer = stream.answer
    assert "".join(texts).strip() == answer.text and citations == answer.citations
    assert all(isinstance(s.verified, bool) for c in citations for s in c.sources)
    alone = pipeline.answer(PLANTED_QUESTION, passages, max_new_tokens=12)
    assert alone.text == answer.text and citation_shape(alone) == citation_shape(answer)


def test_a_stream_cites_each_sentence_once_the_next_one_begins(pipeline):
    """Unverified, a sentence's citation comes right after the delta that began the next sentence, computed from
    the answer's attention so far, and equals the citation of the same answer generated without streaming."""
    passages = planted_passages(4, 3)
    question = "Tell me about the Zorbland expedition. Then tell me its code word."
    stream = pipeline.answer_stream(question, passages, max_new_tokens=32)
    events = list(stream.events())
    streamed = [e for e in events if isinstance(e, Citation)]
    answer = stream.answer
    assert len(answer.citations) >= 2, answer.text  # the question asks for more than one sentence
    assert streamed == answer.citations
    text_before = []  # the answer text streamed before each citation
    for i, event in enumerate(events):
        if isinstance(event, Citation):
            text_before.append("".join(e for e in events[:i] if isinstance(e, str)).strip())
    for citation, before in zip(streamed[:-1], text_before[:-1], strict=True):
        start, end = citation.span
        assert len(before) > end, "a citation came before the next sentence began"
        assert before[start:end] == answer.text[start:end]
        assert len(before) < len(answer.text), "a citation of a finished sentence waited for the whole answer"
    alone = pipeline.answer(question, passages, max_new_tokens=32)
    assert alone.text == answer.text and citation_shape(alone) == citation_shape(answer)
    for a, b in zip(alone.citations, answer.citations, strict=True):
        assert all(abs(x.score - y.score) < TOL for x, y in zip(a.sources, b.sources, strict=True))


def test_a_batch_hands_each_rows_citations_to_on_citation_as_its_sentences_end(pipeline):
    """generate_batch(on_citation=): every row's Citations, each exactly once, in answer order, interleaved with
    that row's text deltas (a sentence's right after the delta that began the next one), equal to its Answer's."""
    from midlens.generators.models.prompt import build_prompt

    generator = pipeline.generator
    questions = ["Tell me about the Zorbland expedition. Then tell me its code word.", PLANTED_QUESTION]
    prompts = [build_prompt(generator.tokenizer, planted_passages(4, 3), q, 4096) for q in questions]
    events: list[tuple[int, str | Citation]] = []
    answers = generator.generate_batch(
        prompts,
        max_new_tokens=32,
        on_token=lambda row, piece: events.append((row, piece)),
        on_citation=lambda row, citation: events.append((row, citation)),
    )
    plain = generator.generate_batch(prompts, max_new_tokens=32)
    for row, (answer, without) in enumerate(zip(answers, plain, strict=True)):
        mine = [e for r, e in events if r == row]
        cited = [e for e in mine if isinstance(e, Citation)]
        assert cited == answer.citations and answer.text == without.text
        assert citation_shape(answer) == citation_shape(without)  # listening changes nothing of the answer
        assert "".join(e for e in mine if isinstance(e, str)).strip() == answer.text
    long_row = [e for r, e in events if r == 0]
    assert len(answers[0].citations) >= 2, answers[0].text
    first = next(i for i, e in enumerate(long_row) if isinstance(e, Citation))
    before = "".join(e for e in long_row[:first] if isinstance(e, str)).strip()
    assert answers[0].citations[0].span[1] < len(before) < len(answers[0].text)  # handed over mid-answer


def test_verification_is_refused_where_it_cannot_run(pipeline, loaded):
    with pytest.raises(InvalidArgumentError, match=r"max_new_tokens=0: nothing is generated .* no citations to verify"):
        pipeline.ask(QUESTIONS[0], max_new_tokens=0, verify=True)
    with pytest.raises(InvalidArgumentError, match=r"max_new_tokens=0: nothing is generated .* no citations to verify"):
        pipeline.answer_stream(QUESTIONS[0], planted_passages(2, 1), max_new_tokens=0, verify=True)
    with pytest.raises(InvalidArgumentError, match=r"verify=\"yes\": expected True or False"):
        pipeline.ask_many(QUESTIONS, verify="yes")
    quiet = Pipeline(None, Generator(loaded, citations=None))
    with pytest.raises(InvalidArgumentError, match=r"citations off"):
        quiet.answer(PLANTED_QUESTION, planted_passages(2, 1), verify=True)
    assert quiet.answer(PLANTED_QUESTION, planted_passages(2, 1), max_new_tokens=3).citations == []


def test_markers_go_before_closing_punctuation_and_unverified_ones_are_told_apart():
    text = "It opened at the Brea Mall in Brea, California. It was 1987! No source here"
    citations = [
        Citation((0, 47), (0, 9), [CitedSource(3, "c", 0.3, (0, 5)), CitedSource(1, "a", 0.7, (2, 9))]),
        Citation((48, 60), (9, 13), [CitedSource(2, "b", 1.0, None, verified=False, logprob_drop=0.1)]),
        Citation((61, 75), (13, 16), []),
    ]
    answer = SimpleNamespace(text=text, citations=citations)
    marked = marked_answer(answer)
    assert marked.text == "It opened at the Brea Mall in Brea, California [1][3]. It was 1987 [2?]! No source here"
    assert [marked.text[a:b] for a, b in marked.spans] == [
        "It opened at the Brea Mall in Brea, California [1][3].",
        "It was 1987 [2?]!",
        "No source here",
    ]
    assert marked_answer(answer, unverified="drop").text == (
        "It opened at the Brea Mall in Brea, California [1][3]. It was 1987! No source here"
    )
    assert marked_answer(SimpleNamespace(text="", citations=[])).text == ""


def test_ask_warns_under_the_sources_when_no_citation_verified(capsys):
    from midlens.cli.ask import print_citations

    passages = [SimpleNamespace(passage=SimpleNamespace(title=t, text=f"{t} is a passage.")) for t in "AB"]

    def printed(*verified: bool | None) -> str:
        sources = [
            CitedSource(p, str(p), 0.5, (0, 6), v, 0.1 if v is not None else None) for p, v in enumerate(verified, 1)
        ]
        print_citations(
            SimpleNamespace(
                citations=[Citation((0, 5), (0, 2), sources)], passages=passages, restack=None, support=None
            )
        )
        return capsys.readouterr().out

    assert "none verified:" in printed(False, False) and "[1?]" in printed(False, False)
    assert "none verified:" not in printed(True, False)  # one passage the answer needs is enough
    assert "none verified:" not in printed(None, None)  # not checked: nothing to warn about
