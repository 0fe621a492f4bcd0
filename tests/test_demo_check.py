"""The demo's "Check an answer" tab, served for real and driven with gradio_client: an answer written elsewhere, read by
the real SmolLM2-135M (fp32) over pasted or retrieved passages, each sentence linked to the passage it rests on."""

from __future__ import annotations

import html
import re

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from midlens.demo.backend import MAX_PASTED_CHARS, MAX_TOP_K, UserError, pasted_passages
from midlens.demo.check_views import EXAMPLE_ANSWER, EXAMPLE_TITLES, example
from midlens.generators.answering.check import NO_SUPPORT_MODEL
from midlens.generators.answering.support import BAND_WORDS
from tests.conftest import PLANTED_FACT, planted_passages
from tests.test_demo import MODEL, column, served, unwrap

QUESTION = "What is the secret code word of the Zorbland expedition?"
GOLD_AT = 2
# Written by a person: the first sentence rests on the planted fact (passage 2), the second on nothing given.
RIGHT, MADE_UP = "The secret code word is 'pelican'.", "It was chosen in 1920 by the Romans."


@pytest.fixture(scope="module")
def client(pipeline):
    with served(pipeline) as url:
        yield Client(url, verbose=False)


def check(client: Client, question: str, answer: str, pasted: str, top_k: int = 3, verify: bool = True) -> tuple:
    outputs = client.predict(question, answer, pasted, MODEL, top_k, None, verify, api_name="/check")
    return tuple(unwrap(o) for o in outputs)


def rows_of(table: dict, sentence: int) -> list[dict]:
    """The table's rows for one answer sentence (1-based), as dicts by column."""
    return [dict(zip(table["headers"], row, strict=True)) for row in table["data"] if int(row[0]) == sentence]


def test_each_sentence_links_to_the_passage_it_rests_on_and_the_made_up_one_is_named(client):
    passages = planted_passages(4, GOLD_AT)
    pasted = "\n\n".join(p.text for p in passages)
    answer_md, passages_html, table = check(client, QUESTION, f"{RIGHT} {MADE_UP}", pasted)

    # The table: sentence 1 rests on pasted passage 2, the planted fact, and needs it; sentence 2 needs none.
    assert column(table, "sentence") == sorted(column(table, "sentence"))
    first = rows_of(table, 1)
    gold = next(r for r in first if r["rests on passage"] == f"[{GOLD_AT}] pasted {GOLD_AT}")
    assert gold["answer sentence"] == RIGHT and gold["passage sentence"] == PLANTED_FACT
    # Over 5 nats lost without the fact (the evaluator's test measured 12.6): "much less likely", in words.
    assert gold["needed"] == "yes: the sentence becomes much less likely without this passage"
    second = rows_of(table, 2)
    assert second and all(r["answer sentence"] == MADE_UP and not r["needed"].startswith("yes") for r in second)

    # The page: the right sentence is a link to the planted fact's sentence id, that id is in the passages drawn,
    # the marker says the check passed, and the made-up sentence is the one listed.
    spans = re.findall(r'<span class="asent ([\w-]+)" tabindex="0" data-cites="([^"]*)">(.*?)</span>', answer_md)
    assert [html.unescape(re.sub(r"\\(.)", r"\1", text)) for _, _, text in spans] == [RIGHT, MADE_UP]
    assert spans[0][0] == "cite-ok" and f"c-{GOLD_AT}-0" in spans[0][1].split()
    assert spans[1][0] != "cite-ok"
    assert f'data-sid="c-{GOLD_AT}-0"' in passages_html and f"[{GOLD_AT}✓]" in answer_md
    assert "**1 of 2 sentences may not rest on the passages:**" in answer_md and f"\n- {MADE_UP}" in answer_md
    # The support line says what Pipeline.check returned: a checked support model's words, or that none ships.
    words = "|".join(re.escape(w) for w in BAND_WORDS.values())
    assert f"**Support:** none, {NO_SUPPORT_MODEL}." in answer_md or re.search(
        rf"\*\*Support:\*\* ({words}) \(\d\.\d\d+[,;)]", answer_md
    )
    assert all(re.fullmatch(r"(\d\.\d\d+)?", str(v or "")) for v in column(table, "support"))


def test_the_pages_example_links_its_first_sentence_to_the_middle_paragraph_and_names_the_second(client):
    question, answer, pasted = example()
    assert pasted.count("\n\n") == len(EXAMPLE_TITLES) - 1 and answer == EXAMPLE_ANSWER
    answer_md, _, table = check(client, question, answer, pasted)
    first, second = rows_of(table, 1), rows_of(table, 2)
    # The middle paragraph (Torrid's, which says where its first store opened) is needed by the first sentence
    # (measured 6.9 to 8.0 nats lost without it over runs, baseline SmolLM2); the made-up founder needs no paragraph.
    held = next(r for r in first if r["rests on passage"] == "[2] pasted 2")
    assert held["needed"].startswith("yes") and "Brea Mall in Brea, California" in held["passage sentence"]
    assert not any(r["needed"].startswith("yes") for r in second)
    assert "**1 of 2 sentences may not rest on the passages:**" in answer_md and "Walt Disney" in answer_md


def test_a_flagged_sentence_is_not_marked_as_resting_on_the_passage_it_needs(client):
    """Issue 83 A: the tab marked "The founder named the chain after her cat." [1✓] in green ("removing this passage
    changes the answer") and listed it under "may not rest on the passages" (0.05). The real SmolLM2 over the
    example's paragraphs needs Torrid's for that sentence's wording (measured 2.4 nats) and scores it in the "check
    this" band: a passage it needs is marked as shaping its wording, in a look of its own, never with a check mark or
    a "yes"."""
    question, _, pasted = example()
    made_up = "The founder named the chain after her cat."
    answer_md, _, table = check(client, question, f"The first Torrid store opened in the Brea Mall. {made_up}", pasted)
    assert f"may not rest on the passages:** check them:\n- {made_up}" in answer_md
    spans = re.findall(r'<span class="asent ([\w-]+)"[^>]*>(.*?)</span>((?:<sup[^>]*>[^<]*</sup>)*)', answer_md)
    founder = next((kind, marks) for kind, text, marks in spans if text.startswith("The founder"))
    assert founder[0] == "cite-shapes" and "✓" not in founder[1] and "cite-shapes" in founder[1], founder
    needed = [r["needed"] for r in rows_of(table, 2)]
    assert any(n.startswith("for its wording only:") for n in needed) and not any(n.startswith("yes") for n in needed)
    assert "[2✓]" in answer_md  # the first sentence rests on the paragraph that says where the store opened


def test_without_pasted_passages_the_answer_is_read_over_the_corpus(client, pipeline):
    question, written, _ = example()
    answer_md, passages_html, table = check(client, question, written, "", top_k=3, verify=False)
    retrieved = [p.title for p in pipeline.retrieve(question, 3)]
    shown = [html.unescape(h) for h in re.findall(r'<div class="passage-head">\[\d+\] (.*?)  ·', passages_html)]
    assert shown == retrieved
    assert "★ key passage" in passages_html  # the embedded question's gold paragraphs are marked
    assert "Citations not checked" in answer_md
    assert set(column(table, "needed")) <= {"not checked", ""}


@pytest.mark.parametrize(
    ("question", "answer", "pasted", "message"),
    [
        (QUESTION, "  ", "", "The answer to check is empty"),
        ("", RIGHT, "", "The question is empty"),
        (QUESTION, RIGHT, "x" * (MAX_PASTED_CHARS + 1), "paste at most 20000"),
    ],
)
def test_bad_input_is_a_message(client, question, answer, pasted, message):
    with pytest.raises(AppError, match=re.escape(message)):
        check(client, question, answer, pasted)


def test_the_needed_column_says_in_words_how_much_a_passage_matters():
    """Issue 83 F: "yes (log-probability -5.90 without it)" was shown to people who read no log-probabilities."""
    from midlens.demo.check_views import _needed

    assert _needed(True, 5.9) == "yes: the sentence becomes much less likely without this passage"
    assert _needed(True, 0.8) == "yes: the sentence becomes less likely without this passage"
    assert _needed(False, 0.1) == "no: the sentence is barely less likely without this passage"
    assert _needed(False, -0.3) == "no: the sentence is as likely or more without this passage"
    assert _needed(None, None) == "not checked" and _needed(True, None) == "yes"
    assert not any("log-probability" in _needed(v, d) for v in (True, False) for d in (5.9, -0.3))


def test_pasted_passages_are_blocks_separated_by_blank_lines():
    passages = pasted_passages("First  passage\nstill the first.\n\n \nSecond one.\n")
    assert [(p.title, p.id, p.text) for p in passages] == [
        ("pasted 1", "pasted-1", "First passage still the first."),
        ("pasted 2", "pasted-2", "Second one."),
    ]
    assert pasted_passages("  ") == []
    with pytest.raises(UserError, match=f"paste at most {MAX_TOP_K}"):
        pasted_passages("\n\n".join(["p"] * (MAX_TOP_K + 1)))
