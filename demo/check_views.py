"""A checked answer (`Pipeline.check`: an answer written elsewhere, read over passages) -> what the "Check an answer"
tab shows. Pure functions, as views.py: the answer with its sentences linked to the passage sentences they rest on,
the support line as `Pipeline.check` returns it, and one table row per (answer sentence, passage it rests on)."""

from __future__ import annotations

import html
from functools import lru_cache

import pandas as pd

from midlens.demo import views
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.check import (
    NO_SUPPORT_MODEL,
    CheckedSupport,
    doubted,
    sentence_support,
    unsupported,
    verified,
)
from midlens.generators.answering.citations import marker_order
from midlens.generators.answering.support import UNLIKELY_BELOW, shown

# The check tab's sentence ids ("c-<position>-<start>") stay apart from the Ask tab's ("m-", "b-"): one document
# holds both tabs, and pointing at a sentence marks only its own tab's passages.
PREFIX = "c"
# The example: the first example question of the Ask tab, three of the corpus' paragraphs (the one that holds the
# answer in the middle) and an answer whose first sentence that paragraph holds and whose second none does. Read by
# the real SmolLM2-135M, the first sentence needs the middle paragraph and the second needs none
# (tests/test_demo_check.py).
EXAMPLE_TITLES = ("Candice Swanepoel", "Torrid (clothing retailer)", "Brea Mall")
EXAMPLE_ANSWER = (
    "The first Torrid store opened in the Brea Mall in Brea, California. Torrid was founded by Walt Disney in 1923."
)
TABLE_COLUMNS = ["sentence", "answer sentence", "support", "rests on passage", "needed", "passage sentence"]
# Shares of the table's width, each header's longest word whole at 1280 px; the two sentences take the rest.
TABLE_WIDTHS = ["9%", "25%", "8%", "12%", "16%", "30%"]


@lru_cache(maxsize=1)
def example() -> tuple[str, str, str]:
    """The example's (question, answer, pasted passages), the passages from the embedded corpus."""
    from midlens.retrievers.corpus import default_corpus_path, read_documents

    texts = {d["title"]: d["text"] for d in read_documents(default_corpus_path())}
    question = views._questions()[views.MID_PROMPT_EXAMPLE_ID]["question"].strip()
    return question, EXAMPLE_ANSWER, "\n\n".join(" ".join(texts[t].split()) for t in EXAMPLE_TITLES)


def support_line(answer: Answer) -> str:
    """Whether to trust the answer, in the support model's words (`Answer.support`, as `Pipeline.check` returns it:
    a checked answer's is its weakest sentence's); where no support model ships for checked answers of this model,
    saying so instead of guessing."""
    if answer.support is None:
        return f"**Support:** none, {NO_SUPPORT_MODEL}."
    weakest = ", its weakest sentence's" if isinstance(answer.support, CheckedSupport) else ""
    return f"**Support:** {html.escape(answer.support.words)}{weakest}."


def sentence_verdict(answer: Answer) -> str:
    """The sentences that may not rest on the passages (`generators.answering.check.unsupported`: citing none, needing
    none of those cited once checked by removing each, or scored low by a checked support model), listed; unchecked
    citations are said to be so."""
    flagged = unsupported(answer)
    n = len(answer.citations)
    lines = []
    if not verified(answer):
        lines.append(
            "Citations not checked: each sentence is linked to the passage its reading rests on. Tick "
            '"Check citations" to find the sentences that need none of them.'
        )
    elif not flagged:
        lines.append(f"✓ **Each of the {n} sentences rests on a passage it needs:** without it, it is less likely.")
    if flagged:
        listed = "".join(f"\n- {views._md_text(answer.text[c.span[0] : c.span[1]])}" for c in flagged)
        lines.append(f"⚠ **{len(flagged)} of {n} sentences may not rest on the passages:** check them:{listed}")
    return "\n\n".join(lines)


def checked_markdown(answer: Answer) -> str:
    """The checked answer with its [n] markers and linked sentences, the support line, the per-sentence verdict and
    the markers' legend."""
    who = html.escape(f"{views.method_label(answer)}, {answer.model}")
    lines = [
        f"**Checked answer** (read by {who}): {views.cited_answer_html(answer, PREFIX)}",
        support_line(answer),
        sentence_verdict(answer),
    ]
    legend = views.citation_legend_html(answer)
    if legend:
        lines.append(legend)
    if answer.dropped:
        lines.append(f"{len(answer.dropped)} passages did not fit in the model's prompt and were left out.")
    return "\n\n".join(lines)


def _needed(verified_: bool | None, drop: float | None, doubted: bool = False) -> str:
    """Whether the sentence needs the passage, and how much less likely it becomes without it, in words a reader
    without log-probabilities follows (the number is in `midlens check`'s output and the JSON). A flagged
    (`doubted`) sentence that needs it needs it for its wording: never a plain "yes" beside "may not rest on the
    passages"."""
    if verified_ is None:
        return "not checked"
    if drop is None:
        return ("for its wording only" if doubted else "yes") if verified_ else "no"
    if verified_:
        how = "becomes much less likely" if drop >= views.MUCH_LESS_LIKELY else "becomes less likely"
        if doubted:
            return f"for its wording only: the sentence {how} without this passage, but may not rest on it"
        return f"yes: the sentence {how} without this passage"
    how = "is barely less likely" if drop > 0 else "is as likely or more"
    return f"no: the sentence {how} without this passage"


def sentence_table(answer: Answer) -> pd.DataFrame:
    """One row per (answer sentence, passage it rests on), in answer order then prompt order; a sentence that rests
    on no passage has one row saying so."""
    by_position = {p.position: p.passage for p in answer.passages}
    rows = []
    support = sentence_support(answer) or [None] * len(answer.citations)  # None: no per-sentence support model
    edges = (UNLIKELY_BELOW,) if answer.support is None else (UNLIKELY_BELOW, answer.support.likely_from)
    sentences = zip(answer.citations, support, doubted(answer), strict=True)
    for i, (citation, p, doubt) in enumerate(sentences, start=1):
        said, score = answer.text[citation.span[0] : citation.span[1]], "" if p is None else shown(p, *edges)
        if not citation.sources:
            rows.append([i, said, score, "none", "", ""])
        for source in marker_order(citation.sources):
            passage = by_position[source.position]
            cited = "" if source.sentence is None else passage.text[source.sentence[0] : source.sentence[1]]
            name = f"[{source.position}] {passage.title or '(untitled)'}"
            rows.append([i, said, score, name, _needed(source.verified, source.logprob_drop, doubt), cited])
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)
