"""The Gradio demo, served for real on a free local port and driven with gradio_client."""

from __future__ import annotations

import html
import re
import socket
import threading
from contextlib import contextmanager

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from midlens.core.passage import Passage
from midlens.demo.app import create_demo, launch
from midlens.demo.backend import DemoBackend, UserError
from midlens.demo.views import (
    EXAMPLE_IDS,
    KEY_MARK,
    LINKED_EXAMPLE_ID,
    MAX_SHADE,
    MID_PROMPT_EXAMPLE_ID,
    _questions,
    example_questions,
    gold_titles,
)
from midlens.rag.pipeline import Pipeline

MODEL = "smollm2-135m"
UPLOAD_LIMIT_MB = 0.01  # ~10 KB, so the too-large case needs no big file
# Words a first-time reader does not know; the first screen keeps them (and their numbers) under Details.
JARGON = ("calibrated", "prefill", "attribution", "retrieval")
TRUST = re.compile(
    r"(✓|⚠) \*\*(Backed by a passage|Backed|Likely supported|Uncertain|Check this answer|No answer):\*\* "
)
# The legend's end scores: a hover's title and a data attribute, never text a reader sees.
LEGEND_NUMBERS = re.compile(
    r'class="legend-lo" data-score="([-+]\d\.\d{4})">[^<\d]*<.*class="legend-hi" data-score="([-+]\d\.\d{4})">[^<\d]*<'
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(pipeline: Pipeline, **options):
    """The demo on 127.0.0.1:<free port>, closed afterwards."""
    demo = create_demo(pipeline, **options)
    _, url, _ = launch(demo, port=free_port(), prevent_thread_lock=True)
    try:
        yield url
    finally:
        demo.close()


@pytest.fixture(scope="module")
def server(pipeline):
    with served(pipeline, max_upload_mb=UPLOAD_LIMIT_MB) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return Client(server, verbose=False)


def ask(
    client: Client,
    question: str,
    method="baseline",
    compare=False,
    top_k=3,
    view="calibrated",
    corpus=None,
    restack=False,
):
    outputs = client.predict(question, MODEL, method, compare, top_k, view, corpus, 4, False, restack, api_name="/ask")
    return tuple(unwrap(o) for o in outputs)


def unwrap(output):
    """The value of an output the app returns as a component update (a table or plot with new widths/limits)."""
    if isinstance(output, dict) and output.get("__type__") == "update":
        return output.get("value")
    return output


def headers(passages: str) -> list[str]:
    """The header line of each passage in the passages' HTML, as the page shows it."""
    return [html.unescape(h) for h in re.findall(r'<div class="passage-head">(.*?)</div>', passages)]


def heat(passages: str) -> list[float]:
    """Each passage text's shade: the opacity of its background."""
    return [float(a) for a in re.findall(r"background-color: rgba\(239, 68, 60, ([\d.]+)\)", passages)]


def heat_text(passages: str) -> str:
    """The passages' texts, without their headers."""
    texts = re.findall(r'<div class="passage-text"[^>]*>(.*?)</div>', passages)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", t)) for t in texts)


def column(table: dict, header: str) -> list:
    return [row[table["headers"].index(header)] for row in table["data"]]


def legend_range(legend: str) -> tuple[float, float]:
    match = LEGEND_NUMBERS.search(legend)
    assert match, legend
    return float(match[1]), float(match[2])


def test_example_notes_hold_for_the_default_retrieval():
    from midlens.retrievers.build import build_retriever
    from midlens.retrievers.corpus import default_corpus_path

    retriever = build_retriever(default_corpus_path())  # what `midlens demo` uses: dense+links, the cached index
    questions = _questions()
    assert all(i in questions for i in EXAMPLE_IDS)
    gold_at = {}
    for i in EXAMPLE_IDS:
        hits = retriever.search(questions[i]["question"], 5)
        gold_at[i] = [
            (k, h.metadata.get("linked_from")) for k, h in enumerate(hits, 1) if h.title in questions[i]["gold_titles"]
        ]
    assert [k for k, _ in gold_at[MID_PROMPT_EXAMPLE_ID]] == [3], gold_at
    assert [k for k, _ in gold_at[EXAMPLE_IDS[1]]] == [1], gold_at
    assert [(k, bool(via)) for k, via in gold_at[LINKED_EXAMPLE_ID]] == [(3, True)], gold_at
    assert [k for k, _ in gold_at[EXAMPLE_IDS[3]]] == [1, 2], gold_at
    mid = questions[MID_PROMPT_EXAMPLE_ID]
    assert example_questions()[0][0] == mid["question"].strip()
    assert gold_titles("  " + mid["question"] + " ") == mid["gold_titles"]
    assert gold_titles("not a HotpotQA question") == []


def test_ask_returns_answer_and_evidence_in_prompt_order(client, pipeline):
    question = example_questions()[0][0]
    outputs = ask(client, question)
    answer_md, passages, base_md, base_passages, ranks_md, table, plot, attribution, legend, details = outputs
    assert answer_md.startswith(f"**Answer** (baseline, {MODEL}):")
    assert TRUST.search(answer_md) and "The dataset's answer to this example: *Brea, California*" in answer_md
    # The numbers are one click away, under Details.
    assert re.search(r"\*\*baseline\*\* \(smollm2-135m\): \d+ prompt tokens, [0-4] generated; prefill", details)
    expected = pipeline.retrieve(question, 3)
    heads = headers(passages)
    assert len(heads) == 3 and len(heat(passages)) == 3
    evidence = column(table, "baseline evidence")
    labels = {1: "read most", 2: "read 2nd most", 3: "read least"}
    for i, (head, p) in enumerate(zip(heads, expected, strict=True), start=1):
        assert head.startswith(f"[{i}] {p.title}  ·  {labels[column(table, 'baseline rank')[i - 1]]}")
    # The shading spans the scores shown: none for the lowest, MAX_SHADE for the highest, as the legend says.
    values = heat(passages)
    assert min(values) == 0.0 and max(values) == pytest.approx(MAX_SHADE)
    assert values.index(max(values)) == evidence.index(max(evidence))
    assert legend_range(legend) == pytest.approx((min(evidence), max(evidence)), abs=1e-4)
    assert "read least" in legend and "read most" in legend
    # Issue 74 F: the raw scores ("score +0.0326") are a hover's text, not words on the page.
    assert "score" not in re.sub(r'(title|data-score)="[^"]*"', "", legend)
    assert not any(word in (answer_md + legend + str(heads)).lower() for word in JARGON)
    # The gold passage (Torrid) is at prompt position 3 and the rank table tracks it.
    assert "Torrid (clothing retailer)" in heads[2] and KEY_MARK in heads[2]
    assert "| Torrid (clothing retailer) | 3 |" in ranks_md
    assert base_md == "" and base_passages == ""
    assert table["headers"][:4] == ["position", "title", "retrieval", "baseline evidence"]
    assert [row[0] for row in table["data"]] == [1, 2, 3]
    ranks = [row[table["headers"].index("baseline rank")] for row in table["data"]]
    assert sorted(ranks) == [1, 2, 3]
    assert [row[2] for row in plot["data"]] == ["baseline"] * 3
    shares = [row[2] for row in attribution["data"]]
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)


def test_method_switch_runs_side_by_side_on_the_same_passages(client):
    question = example_questions()[1][0]
    answer_md, passages, base_md, base_passages, ranks_md, table, plot, _, legend, _ = ask(
        client, question, method="ms-poe", compare=True
    )
    assert answer_md.startswith(f"**Answer** (ms-poe, {MODEL}):") and TRUST.search(answer_md)
    assert base_md.startswith(f"**Answer** (baseline, {MODEL}):") and TRUST.search(base_md)
    titles = [h.split("  ·  ")[0] for h in headers(passages)]
    assert titles == [h.split("  ·  ")[0] for h in headers(base_passages)]
    assert "rank under ms-poe | rank under baseline" in ranks_md
    assert {"ms-poe evidence", "baseline evidence"} <= set(table["headers"])
    ms_poe = [row[table["headers"].index("ms-poe evidence")] for row in table["data"]]
    baseline = [row[table["headers"].index("baseline evidence")] for row in table["data"]]
    # Ms-PoE rescales positions in most layers, so the attention the passages receive must change.
    assert ms_poe != baseline
    assert sorted({row[2] for row in plot["data"]}) == ["baseline", "ms-poe"]
    # One scale for both columns: the same colour is the same score, and the legend spans both.
    assert max(heat(passages) + heat(base_passages)) == pytest.approx(MAX_SHADE)
    assert min(heat(passages) + heat(base_passages)) == 0.0
    assert legend_range(legend) == pytest.approx((min(ms_poe + baseline), max(ms_poe + baseline)), abs=1e-4)


def test_restacked_answers_say_what_the_prompt_held_and_keep_the_retrieved_numbering(client):
    question = example_questions()[0][0]
    plain = ask(client, question, top_k=4)
    answer_md, passages, base_md, *_ = ask(client, question, compare=True, top_k=4, restack=True, method="ms-poe")
    held = re.search(r"its prompt held ((?:\[\d\], )*\[\d\]), in that order", answer_md)
    assert held, answer_md
    assert sorted(int(n) for n in re.findall(r"\d", held.group(1))) == [1, 2, 3, 4]
    assert [h.split("  ·  ")[0] for h in headers(passages)] == [h.split("  ·  ")[0] for h in headers(plain[1])]
    assert "re-ordered" not in base_md and "re-ordered" not in plain[0]  # the baseline column reads them as retrieved
    assert not any(word in answer_md.lower() for word in JARGON)


def test_raw_scores_view(client):
    _, passages, *_, table, _, _, legend, _ = ask(client, example_questions()[3][0], top_k=2, view="raw")
    raw = column(table, "baseline evidence")
    assert all(v > 0 for v in raw)  # raw attention mass is positive; calibrated scores need not be
    assert max(heat(passages)) == pytest.approx(MAX_SHADE)
    assert legend_range(legend) == pytest.approx((min(raw), max(raw)), abs=1e-4)


@pytest.mark.parametrize(
    "question, top_k, message",
    [
        ("   ", 3, "The question is empty"),
        ("Who founded Torrid?", 0, "Value 0 is less than minimum value 1"),  # Gradio's slider bound check
        ("Who founded Torrid?", 2.5, "top-k must be a whole number from 1 to 10"),
    ],
)
def test_bad_input_returns_the_message(client, question, top_k, message):
    with pytest.raises(AppError, match=message):
        ask(client, question, top_k=top_k)


def test_uploaded_corpus_is_used_and_oversized_upload_is_refused(client, tmp_path):
    small = tmp_path / "zorbland_notes.md"
    small.write_text("The Zorbland expedition's secret code word is 'pelican'.\n\nIt sailed in 1911.\n")
    answer_md, passages, *_, legend, _ = ask(
        client, "What is the Zorbland code word?", top_k=1, corpus=handle_file(str(small))
    )
    assert headers(passages)[0].startswith("[1] zorbland notes  ·  the only passage")
    assert "pelican" in heat_text(passages)
    assert "nothing to compare" in legend and "dataset's answer" not in answer_md  # HotpotQA's labels do not apply
    big = tmp_path / "big.txt"
    big.write_text("lorem ipsum dolor sit amet\n" * 1000)  # ~26 KB > the 10 KB limit set for this server
    with pytest.raises(AppError, match=r"corpus upload big.txt is 26\.\d KB; the demo indexes at most 10\.\d KB"):
        ask(client, "What is lorem?", corpus=handle_file(str(big)))
    bad = tmp_path / "notes.pdf"
    bad.write_text("not really a pdf")
    with pytest.raises(AppError, match=r"Invalid file type. Please upload a file that is one of these formats"):
        ask(client, "What is this?", corpus=handle_file(str(bad)))


def test_an_upload_error_names_the_file_once(pipeline, tmp_path):
    """The corpus reader's message starts with the path it read; the server's temp copy's path becomes the name the
    user chose, once, and the line it names is kept."""
    bad = tmp_path / "upload-123" / "notes.jsonl"
    bad.parent.mkdir()
    bad.write_text('{"text": "fine"}\n["no text"]\n')
    with pytest.raises(UserError) as refused:
        DemoBackend(pipeline).retriever(str(bad))
    message = str(refused.value)
    assert message.startswith('corpus upload notes.jsonl:2: each line must be an object with a string "text"')
    assert message.count("notes.jsonl") == 1 and str(tmp_path) not in message


def test_two_users_at_once_get_their_own_results(server, pipeline):
    questions = [example_questions()[0][0], example_questions()[2][0]]
    results: dict[int, list] = {}

    def user(i: int) -> None:
        results[i] = ask(Client(server, verbose=False), questions[i], top_k=2)

    threads = [threading.Thread(target=user, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == [0, 1]
    for i, q in enumerate(questions):
        expected = [f"[{j}] {p.title}  ·  " for j, p in enumerate(pipeline.retrieve(q, 2), start=1)]
        got = [h[: len(e)] for h, e in zip(headers(results[i][1]), expected, strict=True)]
        assert got == expected


def test_prompt_over_the_window_is_a_message(pipeline, tmp_path):
    from midlens.retrievers.dense import DenseRetriever

    words = " ".join(f"word{i}" for i in range(3000))  # ~3 passages of this exceed the 8k window
    long = [Passage(text=words, title=f"long {i}", id=str(i)) for i in range(3)]
    retriever = DenseRetriever.from_passages(long, tmp_path / "idx")
    backend = DemoBackend(Pipeline(retriever, pipeline.generator, top_k=3))
    too_long = "The prompt is too long for smollm2-135m: .* not even the first passage fits. To fix it, upload a corpus"
    with pytest.raises(UserError, match=too_long):
        backend.ask("What is word7?", MODEL, "baseline", False, 3)


def test_unknown_model_or_method_is_a_message(pipeline):
    backend = DemoBackend(pipeline)
    with pytest.raises(UserError, match="method 'no-such' is not available with smollm2-135m; choose one of baseline"):
        backend.ask("Who founded Torrid?", MODEL, "no-such", False, 3)
    # Trained methods are offered per model where their artefact ships: for both packaged models now.
    assert {"mudaf", "moice"} <= set(backend.methods_of(MODEL)) & set(backend.methods_of("qwen2.5-coder-0.5b"))
    with pytest.raises(UserError, match="model 'gpt-9' is not offered here"):
        backend.ask("Who founded Torrid?", "gpt-9", "baseline", False, 3)


def test_a_passage_stacked_by_a_link_says_which_passage_named_it(pipeline, default_retriever):
    from midlens.demo import views
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.links import LinkedRetriever

    backend = DemoBackend(Pipeline(LinkedRetriever(default_retriever), pipeline.generator, top_k=3))
    question = next(q for q, note in example_questions() if "link" in note)
    result = backend.ask(question, MODEL, "baseline", False, 3, max_new_tokens=4)
    heads = [seg[0] for seg in views.highlighted(result["answers"][0], "raw", result["gold"]) if seg[1] is None]
    assert len(heads) == 3
    assert heads[2].startswith("[3] Candice Swanepoel  ·  named by Victoria's Secret Fashion Show 2009  ·  read")
    assert KEY_MARK in heads[2] and "named by" not in heads[0] + heads[1]


def fake_answer(text: str, texts: list[str], scores: list[float], question: str = "Where did it open?"):
    """An Answer over passages with the given texts and (raw = calibrated) scores, as the generator returns it."""
    from midlens.demo.views import ranks
    from midlens.generators.answering.answer import Answer
    from midlens.generators.attention.evidence import EvidenceConfig, PassageEvidence

    passages = [
        PassageEvidence(i + 1, Passage(text=t, title=f"P{i + 1}", id=str(i)), None, s, s, None, r)
        for i, (t, s, r) in enumerate(zip(texts, scores, ranks(scores), strict=True))
    ]
    return Answer(question, text, passages, MODEL, {"name": "baseline"}, EvidenceConfig(), 10, 2, {})


@pytest.mark.parametrize(
    "text, scores, verdict",
    [
        ("Brea", [0.02, 0.06, 0.02], "✓ **Backed by a passage:** the answer's words are in passage 2, *P2*"),
        # a lead of 0.001 over the runner-up, under 0.2 x the average 0.04
        (
            "Brea",
            [0.040, 0.041, 0.039],
            "it read passage 2, *P2*, about as much as passage 1, *P1*.",
        ),
        ("Brea", [0.06, 0.02, 0.02], "read most (passage 1, *P1*) lacks the answer's words; they are in passage 2"),
        ("Anaheim", [0.06, 0.02, 0.02], "lacks the answer's words; no passage has them."),
        ("Yes", [0.06, 0.02, 0.02], "a yes/no answer has no words to find in a passage; read passage 1"),
        ("It did open.", [0.06, 0.02, 0.02], "it only repeats the question"),
        ("Brea, no doubt", [0.02, 0.06, 0.02], "✓ **Backed by a passage:**"),
        ("", [0.06, 0.02, 0.02], "⚠ **No answer:** the model wrote nothing"),
    ],
)
def test_trust_line_says_in_plain_words_whether_a_passage_backs_the_answer(text, scores, verdict):
    from midlens.demo import views

    answer = fake_answer(text, ["It opened in Torrance.", "The first store opened in Brea, California.", "Gr."], scores)
    got = views.trust(answer, "calibrated")
    assert verdict in got.text
    assert got.backed == verdict.startswith("✓")


def test_the_verdict_gives_no_frequency_for_a_method_the_support_model_was_not_fitted_on():
    """Issue 83 B: for an ms-poe answer the CLI said "(0.29, not calibrated for ms-poe)" while the demo said "about
    29 in 100 answers scored like this one are right", a frequency the support model does not back for that method.
    The first screen now says, in plain words, that how often is not known for it; Details carry the CLI's words."""
    from midlens.demo import views
    from midlens.generators.answering.support import Support

    texts = ["It opened in Torrance.", "The first store opened in Brea, California.", "Gr."]
    answer = fake_answer("Brea", texts, [0.02, 0.06, 0.02])
    answer.method = {"name": "ms-poe"}
    answer.support = Support.at(0.29, 0.6562, False, MODEL, ("baseline", "mudaf(alpha=0)"), "ms-poe")
    verdict = views.trust(answer, "calibrated")
    assert TRUST.search(verdict.text) and not verdict.backed
    assert "in 100" not in verdict.text and "29" not in verdict.text
    assert "how often answers like this one are right is not known for ms-poe" in verdict.text
    md = views.answer_markdown(answer, "calibrated")
    assert not any(word in md.lower() for word in JARGON)
    assert "not calibrated for ms-poe" in views.details_markdown([answer])

    # A method it was fitted on: the frequency, where "likely" starts, and no frequency across the band's edge
    # (0.196 is below 0.2: "about 19.6 in 100", never "about 20").
    answer.method, answer.support = (
        {"name": "baseline"},
        Support.at(0.196, 0.6562, False, MODEL, ("baseline",), "baseline"),
    )
    verdict = views.trust(answer, "calibrated").text
    assert verdict.startswith("⚠ **Check this answer:** the passages may not support it; about 19.6 in 100 answers")
    assert "(likely supported from 66 in 100)" in verdict and "It rests on" not in verdict


def test_the_intro_says_what_each_answer_shows():
    """Issue 83 F: the intro still said each answer tells whether the passage read most contains the answer; each
    answer now opens with the support score's verdict and cites its passages."""
    from midlens.demo.app import INTRO

    assert "read most contains the answer" not in INTRO
    assert "whether to trust it" in INTRO and "[n]" in INTRO


def test_shading_and_legend_follow_the_scores_shown():
    from midlens.demo import views

    answer = fake_answer("Brea", ["a", "b", "c"], [0.012, 0.048, 0.03])
    scale = views.heat_scale([answer], "calibrated")
    assert [seg[1] for seg in views.highlighted(answer, "calibrated", scale=scale)[1::2]] == [0.0, MAX_SHADE, 0.3]
    legend = views.legend_html(scale, 3)
    assert legend_range(legend) == (0.012, 0.048)
    assert legend.index("read least") < legend.index("legend-bar") < legend.index("read most")
    assert "nothing to compare" in views.legend_html(views.heat_scale([fake_answer("x", ["a"], [0.5])], "raw"), 1)


def test_first_screen_words_for_a_real_answer(pipeline):
    """A real answer from the backend: what the first screen says is plain, names the passage it shades
    darkest, and leaves every number and technical word to Details."""
    from midlens.demo import views

    question = example_questions()[0][0]
    result = DemoBackend(pipeline).ask(question, MODEL, "baseline", False, 5, max_new_tokens=8)
    answer = result["answers"][0]
    scale = views.heat_scale([answer], "calibrated")
    segments = views.highlighted(answer, "calibrated", result["gold"], scale)
    md = views.answer_markdown(answer, "calibrated", result["known"])
    darkest = max(range(5), key=lambda i: segments[2 * i + 1][1])
    assert segments[2 * darkest][0].endswith("read most\n") or KEY_MARK in segments[2 * darkest][0]
    assert f"It read passage {darkest + 1}, *{answer.passages[darkest].passage.title}*, the most." in md
    assert TRUST.search(md) and result["known"] == ["Brea, California"]
    first_screen = (md + views.legend_html(scale, 5) + " ".join(seg[0] for seg in segments[::2])).lower()
    assert not any(word in first_screen for word in JARGON)
    assert not re.search(r"\d\.\d{3}", md + " ".join(seg[0] for seg in segments[::2]))  # no scores in the words
    details = views.details_markdown([answer])
    assert all(word in details for word in ("calibrated", "attribution", "retrieval", "prompt tokens"))


def cited_answer(verified: tuple[bool | None, bool | None] = (None, None), drops=(None, None)):
    """fake_answer with two answer sentences: the first cites passage 2's first sentence and passage 1's second,
    the second cites nothing."""
    from midlens.generators.answering.citations import Citation, CitedSource

    texts = ["It opened in Torrance. Then <it> moved.", "The first store opened in Brea, California. It grew.", "Gr."]
    answer = fake_answer("Brea, *California*. It grew.", texts, [0.02, 0.06, 0.02])
    sources = [
        CitedSource(2, "1", 0.6, (0, 43), verified[0], drops[0]),
        CitedSource(1, "0", 0.4, (23, 39), verified[1], drops[1]),
    ]
    answer.citations = [Citation((0, 19), (0, 5), sources), Citation((20, 28), (5, 8), [])]
    return answer


def test_each_answer_sentence_names_the_passage_sentences_it_cites():
    from midlens.demo import views

    answer = cited_answer()
    md = views.answer_markdown(answer, prefix="b")
    passages = views.passages_html(answer, "calibrated", prefix="b")
    cites = re.findall(r'<span class="asent ([\w-]+)" tabindex="0" data-cites="([^"]*)">(.*?)</span>', md)
    assert cites == [("cite-unchecked", "b-2-0 b-1-23", r"Brea, \*California\*."), ("cite-none", "", "It grew.")]
    sentences = dict(re.findall(r'data-sid="([^"]+)">(.*?)</span>', passages))
    # Every id an answer sentence names is one passage sentence, whose text is the cited characters.
    assert sentences["b-2-0"] == "The first store opened in Brea, California."
    assert sentences["b-1-23"] == "Then &lt;it&gt; moved."  # escaped: a passage is text, never markup
    assert re.findall(r'class="psent cited" data-sid="([^"]+)"', passages) == ["b-1-23", "b-2-0"]
    assert heat_text(passages).startswith("It opened in Torrance. Then <it> moved.")
    assert '<sup class="cite cite-unchecked" title="not checked">[2]</sup>' in md
    assert "not checked" in md and 'tick "Check citations"' in md and "failed the check" not in md
    assert not any(word in md.lower() for word in JARGON)
    # The answer block keeps raw HTML, so what the model wrote and what a corpus holds are escaped.
    answer.text, answer.passages[1].passage.title = "<img src=x onerror=alert(1)>", "<script>x</script>"
    md = views.answer_markdown(answer, "raw", known=["<b>"])
    assert "<img" not in md and "<script>" not in md and "<b>" not in md
    assert "&lt;img src=x" in md and "&lt;script&gt;" in md


def test_checked_citations_look_different_and_back_the_trust_line():
    from midlens.demo import views

    passed = cited_answer((True, False), (3.0, 0.1))
    md = views.answer_markdown(passed)
    assert '<span class="asent cite-ok"' in md
    assert '<sup class="cite cite-ok" title="checked: removing this passage changes the answer">[2✓]</sup>' in md
    assert '<sup class="cite cite-failed" title="failed the check">[1✗]</sup>' in md
    assert all(words in md for words in views.CITE_LEGEND.values()) and "tick" not in md
    assert views.trust(passed, "calibrated") == views.Trust(
        True, "✓ **Backed:** removing passage 2, *P2* makes this answer much less likely."
    )
    # A yes/no answer has no words to look up, but a passing check still backs it.
    passed.text = "Yes, Brea."
    assert views.trust(passed, "calibrated").text.startswith("✓ **Backed:** removing passage 2")
    failed = cited_answer((False, False), (0.2, -0.1))
    assert '<span class="asent cite-failed"' in views.answer_markdown(failed)
    verdict = views.trust(failed, "calibrated")
    assert verdict.backed and verdict.text.startswith("✓ **Backed by a passage:**")  # the words rule still holds
    assert verdict.text.endswith("barely changes the answer: it may come from the model's memory.")
    details = views.details_markdown([failed])
    assert (
        "citations of sentence 1: [1] 40% of its attention to passages, log-probability +0.10 without it (failed the "
        "check); [2] 60% of its attention to passages, log-probability -0.20 without it" in details
    )


MARKERS = re.compile(r'<sup class="cite ([\w-]+)" title="[^"]*">\[(\d+)([^\]]*)\]</sup>')


def test_a_needed_passage_of_a_flagged_sentence_is_no_green_check():
    """Issue 83 A: "[1✓]" in green ("removing this passage changes the answer") marked the sentence the same screen
    lists under "may not rest on the passages" (0.05). A passage the sentence's words need does not make its claim
    supported: no check mark, no "yes", a look and words of its own."""
    from midlens.demo import check_views, views
    from midlens.generators.answering.check import CheckedSupport
    from midlens.generators.answering.support import Support

    checked = cited_answer((True, True), (4.37, 3.11))
    checked.checked = True
    # Sentence 1 needs both passages it cites, yet the checked support model puts it in the "check this" band.
    checked.support = CheckedSupport(0.05, False, 0.56, False, MODEL, (0.05, 0.9))
    md = check_views.checked_markdown(checked)
    assert "may not rest on the passages:** check them:\n- Brea, \\*California\\*." in md
    sentences = re.findall(r'<span class="asent ([\w-]+)"', md)
    assert sentences[0] == "cite-shapes" and "cite-ok" not in sentences
    assert MARKERS.findall(md) == [("cite-shapes", "1", "⚠"), ("cite-shapes", "2", "⚠")]
    assert views.CITE_LEGEND["cite-shapes"] in md and "changes the answer" not in md.split("cite-legend")[0]
    needed = check_views.sentence_table(checked)["needed"].tolist()[:2]
    assert all(n.startswith("for its wording only: the sentence becomes") for n in needed), needed
    assert "(" + views.CITE_LEGEND["cite-shapes"] + ")" in views.details_markdown([checked])

    # A generated answer has one support: in the "check this" band, its needed passages shape it; likely, they back it.
    generated = cited_answer((True, True), (4.37, 3.11))
    generated.support = Support.at(0.05, 0.56, True, MODEL)
    assert {kind for kind, _, _ in MARKERS.findall(views.answer_markdown(generated))} == {"cite-shapes"}
    generated.support = Support.at(0.9, 0.56, True, MODEL)
    assert MARKERS.findall(views.answer_markdown(generated)) == [("cite-ok", "1", "✓"), ("cite-ok", "2", "✓")]


def test_the_demo_and_the_shell_mark_a_sentences_passages_in_one_order():
    """Issue 83 F: the same answer was marked "[4][3]" in the demo (the rule's ranking) and "[3][4]" in the shell
    (prompt order). Every view lists a sentence's passages by their number
    (generators.answering.citations.marker_order)."""
    from midlens.demo import check_views, views
    from midlens.rag.pipeline import marked_answer

    answer = cited_answer()
    assert [s.position for s in answer.citations[0].sources] == [2, 1]  # ranked: passage 2 first
    demo = [n for _, n, _ in MARKERS.findall(views.cited_answer_html(answer))]
    shell = re.findall(r"\[(\d+)\??\]", marked_answer(answer).text)
    assert demo == shell == ["1", "2"]
    assert check_views.sentence_table(answer)["rests on passage"].tolist()[:2] == ["[1] P1", "[2] P2"]
    assert "citations of sentence 1: [1] 40%" in views.details_markdown([answer])


def test_check_citations_verifies_against_the_prompt_answered_from(pipeline):
    """The backend checks each answer's citations only when asked (Pipeline.answer's verify=True, on the prompt
    answered from); checking leaves the answer as it was and marks every source passed or failed."""
    question = example_questions()[0][0]
    backend = DemoBackend(pipeline)
    plain = backend.ask(question, MODEL, "baseline", False, 3, max_new_tokens=6)["answers"][0]
    assert plain.citations and all(s.verified is None for c in plain.citations for s in c.sources)
    checked = backend.ask(question, MODEL, "baseline", False, 3, max_new_tokens=6, check_citations=True)["answers"][0]
    assert checked.text == plain.text and "verify_s" in checked.timings
    sources = [s for c in checked.citations for s in c.sources]
    assert sources and all(isinstance(s.verified, bool) and s.logprob_drop is not None for s in sources)
    from midlens.demo import views

    assert TRUST.search(views.trust(checked, "calibrated").text)


def test_the_restack_switch_starts_where_restacking_was_measured_to_help(pipeline, measured_restack):
    """The "Re-order" switch is on for a model and method restacking was measured to help (core.defaults.
    MEASURED_RESTACKS: none today, SmolLM2's default patched in), off otherwise, and both the model and the method
    menus set it again."""
    from midlens.demo.app import build_blocks

    for backend, on in ((DemoBackend(pipeline), False), (DemoBackend(pipeline.with_method("finetuned")), True)):
        blocks = build_blocks(backend)
        switch = next(b for b in blocks.blocks.values() if getattr(b, "elem_id", None) == "restack")
        assert switch.value is on, backend.method
        setters = [f for f in blocks.fns.values() if getattr(f.fn, "__name__", "") == "restack_default"]
        assert len(setters) == 2 and all([o._id for o in f.outputs] == [switch._id] for f in setters)
        assert {f.inputs[0].label for f in setters} == {"Model"} and {f.inputs[1].label for f in setters} == {"Method"}


def test_every_method_on_the_page_cites_with_the_evidence_the_demo_was_started_with(pipeline, default_retriever):
    """`midlens demo --cite-evidence mudaf`: the startup pipeline and every method picked on the page cite with
    MuDAF's evidence (each under the rule measured for itself with it); a page started on a pipeline cites as that
    pipeline does, citations off included."""
    from midlens.generators import Generator
    from midlens.generators.answering.citations import CitationConfig, MeasuredCitations

    gen = Generator(pipeline.generator.loaded, method="baseline", citations=MeasuredCitations(evidence_from="mudaf"))
    backend = DemoBackend(Pipeline(default_retriever, gen, top_k=3))
    for method in ("baseline", "ms-poe", "mudaf"):
        cites = backend.pipeline(MODEL, method).generator.citations
        assert cites == CitationConfig.measured(MODEL, method, evidence_from="mudaf"), method
    silent = DemoBackend(Pipeline(default_retriever, Generator(gen.loaded, method="baseline", citations=None)))
    assert silent.pipeline(MODEL, "ms-poe").generator.citations is None


def test_demo_refuses_a_misspelt_cite_evidence_before_a_server_starts(capsys):
    from midlens.cli import main

    assert main(["demo", "--model", MODEL, "--cite-evidence", "mudaff"]) == 2
    assert "--cite-evidence mudaff" in capsys.readouterr().err


def test_the_demo_beyond_this_machine_needs_a_login_and_asks_for_it(monkeypatch, capsys):
    """Issue 74 F: `midlens demo --host 0.0.0.0` served the model to anyone. Now it is refused without a login
    (before any model loads, as `midlens serve` refuses without a key), and a login given is Gradio's own: a client
    without it is turned away, one with it is answered."""
    import gradio as gr

    from midlens.cli import main

    monkeypatch.delenv("MIDLENS_DEMO_AUTH", raising=False)
    assert main(["demo", "--host", "0.0.0.0", "--model", MODEL]) == 2
    err = capsys.readouterr().err
    assert "--auth USER:PASSWORD" in err and "MIDLENS_DEMO_AUTH" in err and "127.0.0.1" in err
    assert main(["demo", "--host", "0.0.0.0", "--auth", "ana", "--model", MODEL]) == 2
    assert "expected USER:PASSWORD" in capsys.readouterr().err

    page = gr.Interface(str.upper, "text", "text", api_name="predict")
    _, url, _ = launch(page, port=free_port(), prevent_thread_lock=True, auth=("ana", "s3cret"))
    try:
        with pytest.raises(Exception, match="(?i)login|auth|401"):
            Client(url, verbose=False).predict("hi", api_name="/predict")
        assert Client(url, auth=("ana", "s3cret"), verbose=False).predict("hi", api_name="/predict") == "HI"
    finally:
        page.close()


def test_the_answer_header_names_the_method_as_the_menu_does(pipeline):
    """Issue 74 F: the menu said `finetuned` and the answer's header "(mudaf, ...)", the method it stands for."""
    from types import SimpleNamespace

    from midlens.demo import views

    finetuned = pipeline.with_method("finetuned").generator.method.to_dict()  # what its answers carry
    assert views.method_label(SimpleNamespace(method=finetuned)) == "finetuned"
    mudaf = pipeline.with_method("mudaf").generator.method.to_dict()
    assert views.method_label(SimpleNamespace(method=mudaf)) == "mudaf"
    assert views.method_label(SimpleNamespace(method=pipeline.generator.method.to_dict())) == "baseline"


def _answering_controls(backend: DemoBackend) -> tuple[dict, dict]:
    """The page's answering controls over `backend`, built without a model: the Ask tab's by option (found by the
    page's name for each, demo.controls.LABELS) and the check tab's (found by its element ids)."""
    from midlens.demo.app import build_blocks
    from midlens.demo.controls import LABELS

    blocks = build_blocks(backend).blocks.values()
    by_label = {b.label: b for b in blocks if getattr(b, "label", None)}
    ask = {name: by_label[label] for name, label in LABELS.items() if label in by_label}
    check = {
        "top_k": by_label["Passages to retrieve (when none are pasted)"],
        "verify": next(b for b in blocks if getattr(b, "elem_id", None) == "check-verify"),
    }
    return ask, check


def test_each_answering_control_starts_at_answer_options_default(measured_restack):
    """The page has one control per option the demo spells (rag.option_fields.spelt_by("demo"); every other option
    says why not), each starting at AnswerOptions' default, within its bounds, in the page's words (not the API's
    help text, written for a command line): a default changed there, or a control written by hand again with a value
    of its own, fails here. The Re-order switch shows what the default `restack` ("measured") means for the model and
    method; the check tab's "Check citations" starts on, unlike an answer's (checking is what names a sentence that
    needs no passage)."""
    from dataclasses import fields

    from midlens.core.defaults import RESTACK_MEASURED, measured_restack_for
    from midlens.generators.methods.registry import method_config
    from midlens.rag.option_fields import spelt_by
    from midlens.rag.options import AnswerOptions, option_info

    defaults = AnswerOptions()
    for model, method in ((MODEL, "baseline"), (MODEL, "finetuned")):  # restacked by default: no, then yes
        backend = DemoBackend(model=model, method=method)  # no pipeline: the page is built before any model loads
        ask, check = _answering_controls(backend)
        assert set(ask) == set(spelt_by("demo")), set(ask) ^ set(spelt_by("demo"))
        for field in fields(AnswerOptions):
            if field.name not in ask:
                continue
            control, info = ask[field.name], option_info(field.name)
            assert not control.info, field.name
            if field.name == "restack":
                assert field.default == defaults.restack == RESTACK_MEASURED
                measured = measured_restack_for(model, method_config(method).spec())
                assert control.value is (measured is not None), (method, measured)
                continue
            assert control.value == field.default == getattr(defaults, field.name), field.name
            if info.ge is not None:
                assert control.minimum >= info.ge and control.maximum >= control.value, field.name
        assert check["top_k"].value == defaults.top_k
        assert check["verify"].value is True
    assert ask["restack"].value is True  # finetuned SmolLM2: where restacking was measured to help (patched in)


def test_the_answering_controls_follow_the_options_they_spell(monkeypatch):
    """Other defaults in AnswerOptions (a subclass stands for the edited class) reach every control, the
    Re-order switch and the handler that sets it again when the model or method changes included."""
    from dataclasses import dataclass

    from midlens.core.errors import InvalidArgumentError
    from midlens.demo import backend as backend_module
    from midlens.demo.handlers import Handlers
    from midlens.rag.options import AnswerOptions, _option

    @dataclass(frozen=True)
    class Edited(AnswerOptions):
        top_k: int = _option(7, "Edited: passages.", ge=1)
        max_new_tokens: int = _option(33, "Edited: tokens.", ge=0)
        restack: object = _option(None, "Edited: restack.")
        verify: bool = _option(True, "Edited: verify.")
        abstain: bool = _option(True, "Edited: abstain.")

    monkeypatch.setattr(backend_module, "AnswerOptions", Edited)
    backend = DemoBackend(model=MODEL, method="finetuned")  # restacked, were `restack` still "measured"
    ask, check = _answering_controls(backend)
    assert {name: c.value for name, c in ask.items()} == {
        "top_k": 7,
        "max_new_tokens": 33,
        "restack": False,
        "verify": True,
        "abstain": True,
    }
    assert check["top_k"].value == 7
    assert Handlers(backend).restack_default(MODEL, "finetuned") is False
    # Given at startup (`midlens demo --top-k 3`), a value outranks the default; a bad one is refused by name.
    assert _answering_controls(DemoBackend(model=MODEL, method="baseline", top_k=3))[0]["top_k"].value == 3
    with pytest.raises(InvalidArgumentError, match="^top_k=0"):
        DemoBackend(model=MODEL, top_k=0)
