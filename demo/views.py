"""Answer records -> what the demo page shows. Pure functions: no Gradio, no model, easy to test.

The first screen speaks plain words: the answer, which passage the model read most, and whether that passage
backs the answer. The numbers behind those words (evidence scores, ranks, plots, timings) sit one click away
under "Details (scores)". Passages are shaded on a scale spanning the scores actually shown (see HeatScale).
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import pandas as pd

from midlens.core.answer_text import STOPWORDS
from midlens.core.passage import Passage
from midlens.core.sentences import sentence_spans
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.check import FAILED, SHAPES, UNCHECKED, VERIFIED, citation_check, doubted
from midlens.generators.answering.citations import Citation, CitedSource, marker_order
from midlens.generators.answering.support import BAND_WORDS
from midlens.generators.attention.evidence import PassageEvidence
from midlens.retrievers.corpus import default_questions_path

ScoreView = Literal["calibrated", "raw"]
SCORE_VIEWS: tuple[str, ...] = ("calibrated", "raw")
# The Details radio's words for each view; its values stay the view names the API takes.
SCORE_VIEW_CHOICES = [
    ("calibrated: attention minus what an empty question gives the same place", "calibrated"),
    ("raw: share of the question's attention", "raw"),
]

# Example questions from the embedded HotpotQA set, by id. The first one is the mid-prompt case: with the
# default retrieval and top-k 5 its only retrieved gold passage sits at prompt position 3 of 5
# (tests/test_demo.py checks every note below against the default retrieval).
MID_PROMPT_EXAMPLE_ID = "5a79d8ec5542996c55b2dc7e"
LINKED_EXAMPLE_ID = "5a77372b554299373536021c"
EXAMPLE_IDS = (
    MID_PROMPT_EXAMPLE_ID,
    "5ae72c1e554299572ea54754",  # gold at position 1: the easy case
    LINKED_EXAMPLE_ID,  # two hops: the model's own paragraph (position 3) is there because a show's paragraph names her
    "5a70f4695542994082a3e435",  # both gold passages retrieved, at positions 1 and 2
)
# "key passage" is the page's word for HotpotQA's gold (supporting) paragraph.
EXAMPLE_NOTES = {
    MID_PROMPT_EXAMPLE_ID: "key passage in the middle (3rd of 5)",
    "5ae72c1e554299572ea54754": "key passage first",
    LINKED_EXAMPLE_ID: "key passage found through a link (3rd)",
    "5a70f4695542994082a3e435": "two key passages",
}
KEY_MARK = "★ key passage"


@lru_cache(maxsize=1)
def _questions() -> dict[str, dict]:
    rows = [json.loads(line) for line in default_questions_path().read_text(encoding="utf-8").splitlines() if line]
    return {row["id"]: row for row in rows}


def example_questions() -> list[tuple[str, str]]:
    """(question, short note) for the example buttons, mid-prompt case first."""
    questions = _questions()
    return [(questions[i]["question"].strip(), EXAMPLE_NOTES[i]) for i in EXAMPLE_IDS]


def gold_titles(question: str) -> list[str]:
    """Gold passage titles when the question is one of the embedded HotpotQA questions, else []."""
    wanted = " ".join(question.split())
    for row in _questions().values():
        if " ".join(row["question"].split()) == wanted:
            return list(row["gold_titles"])
    return []


def known_answers(question: str) -> list[str]:
    """HotpotQA's answers when the question is one of the embedded questions, else []."""
    wanted = " ".join(question.split())
    for row in _questions().values():
        if " ".join(row["question"].split()) == wanted:
            return list(row["answers"])
    return []


def method_label(answer: Answer) -> str:
    """The method as the menu names it: the shorthand ("finetuned") where the answer's method is one, not the
    method it stands for ("mudaf" with alpha 0)."""
    return next(
        (short for short, config in _shorthand_configs().items() if config == answer.method),
        answer.method.get("name", "?"),
    )


@lru_cache(maxsize=1)
def _shorthand_configs() -> dict[str, dict]:
    from midlens.core.defaults import METHOD_SHORTHANDS
    from midlens.generators.methods.registry import method_config

    return {short: method_config(short, {}).to_dict() for short in METHOD_SHORTHANDS}


def scores(answer: Answer, view: ScoreView) -> list[float]:
    """One score per passage in prompt order: calibrated is each passage's `PassageEvidence.score` (calibrated, raw
    when calibration did not run), raw its attention mass."""
    if view not in SCORE_VIEWS:
        raise ValueError(f"score view {view!r}: choose one of {', '.join(SCORE_VIEWS)}.")
    if view == "calibrated":
        return [float(p.score) for p in answer.passages]
    return [float(p.evidence) for p in answer.passages]


def passage_ranks(answer: Answer, view: ScoreView) -> list[int]:
    """Each passage's rank in the view (1 = strongest), in prompt order: calibrated is `PassageEvidence.rank`, which
    orders by its `score`; raw is ranked here (`ranks`) where calibration ran, the rank otherwise."""
    values = scores(answer, view)  # refuses a view it does not know
    if view == "calibrated" or all(p.calibrated is None for p in answer.passages):
        return [p.rank for p in answer.passages]
    return ranks(values)


def ranks(values: list[float]) -> list[int]:
    """1 = largest value; ties keep prompt order."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    for r, i in enumerate(order, start=1):
        out[i] = r
    return out


# HighlightedText draws a positive float label as rgba(239, 68, 60, label): the label is the opacity. A fixed
# -1..+1 scale left scores of +0.01..+0.05 all pale, so the scale spans the scores on the page instead.
SHADE_RGB = "239, 68, 60"
MAX_SHADE = 0.6  # the most-read passage's opacity: black text on full red is hard to read


@dataclass(frozen=True)
class HeatScale:
    """Shading from the lowest score shown (no colour) to the highest (MAX_SHADE); the legend prints lo and hi."""

    lo: float
    hi: float

    def shade(self, value: float) -> float:
        if self.hi <= self.lo:  # one passage, or all equal: nothing to tell apart
            return 0.0
        return round(MAX_SHADE * (value - self.lo) / (self.hi - self.lo), 4)


def heat_scale(answers: list[Answer], view: ScoreView) -> HeatScale:
    """One scale for every answer on the page, so the same colour means the same score side by side."""
    values = [v for a in answers for v in scores(a, view)]
    return HeatScale(min(values), max(values))


def legend_html(scale: HeatScale, passages: int) -> str:
    """The shading's key in words: its ends are the passages read least and most. A raw score ("+0.0326") means
    nothing to a reader, so the scores at the two ends (the Details table's numbers) are only a hover's title and a
    data attribute."""
    if passages < 2:
        return '<div class="heat-legend">One passage: nothing to compare it with.</div>'
    bar = f"linear-gradient(to right, rgba({SHADE_RGB}, 0), rgba({SHADE_RGB}, {MAX_SHADE}))"
    lo, hi = f"{scale.lo:+.4f}", f"{scale.hi:+.4f}"
    return (
        '<div class="heat-legend">'
        '<span class="legend-title">Shading: how much the model read each passage</span>'
        f'<span class="legend-end" title="score {lo} (Details)">read least'
        f'<small class="legend-lo" data-score="{lo}">no shading</small></span>'
        f'<span class="legend-bar" style="background: {bar}"></span>'
        f'<span class="legend-end" title="score {hi} (Details)">read most'
        f'<small class="legend-hi" data-score="{hi}">darkest</small></span>'
        "</div>"
    )


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def reading_label(rank: int, n: int) -> str:
    """A passage's evidence rank in words."""
    if n == 1:
        return "the only passage"
    if rank == 1:
        return "read most"
    if rank == n:
        return "read least"
    return f"read {_ordinal(rank)} most"


def _passage_header(p: PassageEvidence, rank: int, n: int, key: bool) -> str:
    title = p.passage.title or "(untitled)"
    via = p.passage.metadata.get("linked_from")
    title += f"  ·  named by {via}" if via else ""
    mark = f"  ·  {KEY_MARK}" if key else ""
    return f"[{p.position}] {title}  ·  {reading_label(rank, n)}{mark}\n"


def highlighted(
    answer: Answer, view: ScoreView, gold: list[str] | None = None, scale: HeatScale | None = None
) -> list[tuple[str, float | None]]:
    """Passages in prompt order as (text, shade) pairs: a plain header line (shade None), then the text with its
    shade on the heat scale. `passages_html` draws them."""
    values = scores(answer, view)
    scale = scale or heat_scale([answer], view)
    rank = passage_ranks(answer, view)
    n = len(values)
    gold = gold or []
    segments: list[tuple[str, float | None]] = []
    for p, v, r in zip(answer.passages, values, rank, strict=True):
        segments.append((_passage_header(p, r, n, p.passage.title in gold), None))
        segments.append((" ".join(p.passage.text.split()) + "\n", scale.shade(v)))
    return segments


def attribution_shares(answer: Answer) -> list[float] | None:
    """The answer tokens' attention per passage as shares summing to 1 (None when too short to attribute)."""
    raw = [p.answer_attribution for p in answer.passages]
    if not raw or any(v is None for v in raw):
        return None
    total = sum(max(0.0, v) for v in raw)
    return [0.0 if total == 0 else max(0.0, v) / total for v in raw]


# -- citations: which passage sentences each answer sentence rests on ------------------------------------

# A citation's look follows its check (Generator.verify) read with its sentence's support
# (generators.answering.check.citation_check): one class per outcome, the legend's words for each. A passage a flagged
# sentence needs shapes its wording, not its claim: no green check, the warning mark the flagged list carries.
CITE_CLASSES = {VERIFIED: "cite-ok", SHAPES: "cite-shapes", UNCHECKED: "cite-unchecked", FAILED: "cite-failed"}
CITE_MARKS = {VERIFIED: "✓", SHAPES: "⚠", UNCHECKED: "", FAILED: "✗"}
CITE_LEGEND = {
    "cite-ok": "checked: removing this passage changes the answer",
    "cite-shapes": "checked, for its wording only: removing this passage changes the sentence, which may still not "
    "rest on it",
    "cite-unchecked": "not checked",
    "cite-failed": "failed the check",
}


def sentence_id(prefix: str, position: int, start: int) -> str:
    """The page-wide id of a passage sentence: the answer column's prefix, the passage's prompt position and the
    sentence's first character in Passage.text (what CitedSource.sentence holds, so no index lookup is needed)."""
    return f"{prefix}-{position}-{start}"


def _sentence_class(citation: Citation, doubted_: bool) -> str:
    """An answer sentence is as good as its best source: checked when one passed (shaped only, when the sentence
    is flagged), failed when all failed."""
    outcomes = {citation_check(s, doubted_) for s in citation.sources}
    if not outcomes:
        return "cite-none"
    for best in (VERIFIED, SHAPES):
        if best in outcomes:
            return CITE_CLASSES[best]
    return CITE_CLASSES[FAILED] if outcomes == {FAILED} else CITE_CLASSES[UNCHECKED]


def _cite_mark(source: CitedSource, doubted_: bool) -> str:
    check = citation_check(source, doubted_)
    kind = CITE_CLASSES[check]
    mark = f"[{source.position}{CITE_MARKS[check]}]"
    return f'<sup class="cite {kind}" title="{CITE_LEGEND[kind]}">{mark}</sup>'


def _md_text(text: str) -> str:
    """Text for the answer block as it reads: HTML-escaped, and markdown's inline marks shown, not applied."""
    return re.sub(r"([\\`*_\[\]()~|])", r"\\\1", html.escape(text))


def cited_answer_html(answer: Answer, prefix: str = "m") -> str:
    """The answer text with each sentence a focusable span naming the passage sentences it cites (`data-cites`,
    see sentence_id), followed by one marker per cited passage styled by its check."""
    text = answer.text.strip()
    if not text:
        return "(no answer)"
    lead = len(answer.text) - len(answer.text.lstrip())  # spans count from Answer.text
    out, at = [], 0
    for citation, doubt in zip(answer.citations, doubted(answer), strict=True):
        a, b = citation.span[0] - lead, citation.span[1] - lead
        if a < at or b > len(text):  # a span that does not fit the text shown is not drawn
            continue
        cites = " ".join(sentence_id(prefix, s.position, s.sentence[0]) for s in citation.sources if s.sentence)
        out.append(_md_text(text[at:a]))
        out.append(
            f'<span class="asent {_sentence_class(citation, doubt)}" tabindex="0" data-cites="{cites}">'
            f"{_md_text(text[a:b])}</span>" + "".join(_cite_mark(s, doubt) for s in marker_order(citation.sources))
        )
        at = b
    out.append(_md_text(text[at:]))
    return "".join(out)


def citation_legend_html(answer: Answer) -> str:
    """What the markers mean, in words; empty when the answer cites nothing."""
    sources = [s for c in answer.citations for s in c.sources]
    if not sources:
        return ""
    checked = any(s.verified is not None for s in sources)
    kinds = list(CITE_LEGEND) if checked else ["cite-unchecked"]
    items = "".join(
        f'<span class="legend-item"><sup class="cite {k}">[n{CITE_MARKS[v]}]</sup> {CITE_LEGEND[k]}</span>'
        for v, k in CITE_CLASSES.items()
        if k in kinds
    )
    hint = "" if checked else '<span class="legend-item">(tick "Check citations" to check them)</span>'
    return (
        '<span class="cite-legend"><span class="legend-item">[n]: the passage a sentence rests on; point at or '
        f"click a sentence to mark its sentences in the passages.</span>{items}{hint}</span>"
    )


def _passage_sentences(p: PassageEvidence, prefix: str, cited: set[tuple[int, int]]) -> str:
    """A passage's text with each sentence in its own span (id: sentence_id); cited sentences are kept whole even
    where the segmenter would now split the text differently."""
    text = p.passage.text
    spans = sentence_spans(text)
    for c in cited - set(spans):
        spans = [s for s in spans if s[1] <= c[0] or s[0] >= c[1]] + [c]
    out, at = [], 0
    for start, end in sorted(spans):
        kind = "psent cited" if (start, end) in cited else "psent"
        out.append(html.escape(text[at:start]))
        sid = sentence_id(prefix, p.position, start)
        out.append(f'<span class="{kind}" data-sid="{sid}">{html.escape(text[start:end])}</span>')
        at = end
    out.append(html.escape(text[at:]))
    return "".join(out)


def passages_html(
    answer: Answer,
    view: ScoreView,
    gold: list[str] | None = None,
    scale: HeatScale | None = None,
    prefix: str = "m",
) -> str:
    """The passages in prompt order: a plain header line each, then the text shaded on the heat scale with every
    sentence a span the answer's citations point at (`prefix` keeps two answer columns' ids apart)."""
    segments = highlighted(answer, view, gold, scale)
    cited: dict[int, set[tuple[int, int]]] = {}
    for source in (s for c in answer.citations for s in c.sources if s.sentence):
        cited.setdefault(source.position, set()).add(tuple(source.sentence))
    blocks = []
    for p, (header, _), (_, shade) in zip(answer.passages, segments[::2], segments[1::2], strict=True):
        blocks.append(
            f'<div class="passage" data-position="{p.position}">'
            f'<div class="passage-head">{html.escape(header.strip())}</div>'
            f'<div class="passage-text" style="background-color: rgba({SHADE_RGB}, {shade})">'
            f"{_passage_sentences(p, prefix, cited.get(p.position, set()))}</div></div>"
        )
    return f'<div class="passage-list">{"".join(blocks)}</div>'


# -- can this answer be trusted? -------------------------------------------------------------------------

YES_NO = frozenset({"yes", "no"})
FLAT_GAP = 0.2  # see is_flat()


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def answer_words(answer: str, question: str) -> set[str]:
    """The answer's own words: not stopwords, not yes/no, not already in the question (a small model often
    restates the question, and those words are in every retrieved passage)."""
    return _words(answer) - STOPWORDS - YES_NO - _words(question)


def contains_words(passage: Passage, words: set[str]) -> bool:
    """At least half the words appear in the passage (title included): "Brea" finds "Brea, California"."""
    found = words & _words(f"{passage.title} {passage.text}")
    return bool(words) and 2 * len(found) >= len(words)


def is_flat(answer: Answer, view: ScoreView) -> bool:
    """No passage stands out: the most-read passage leads the runner-up by less than FLAT_GAP of the average
    raw evidence (the attention an average passage receives), in the scores of the view shown. Raw and
    calibrated scores are in the same unit (calibrated is raw minus a content-free question's share), so one
    yardstick serves both. The threshold was read off the 40 embedded questions (SmolLM2-135M, top-k 5,
    calibrated): where the lead is under 0.2 the passage read most was a gold passage in 3 of 11 questions,
    elsewhere in 23 of 29; a flat reading says little about where the answer came from."""
    if len(answer.passages) < 2:
        return False
    first, second = sorted(scores(answer, view), reverse=True)[:2]
    mean = sum(p.evidence for p in answer.passages) / len(answer.passages)
    return mean <= 0 or first - second < FLAT_GAP * mean


@dataclass(frozen=True)
class Trust:
    """A plain-words verdict on one answer: `backed` when the passage read most holds the answer's words."""

    backed: bool
    text: str


# The marks are in the fonts every browser has (no emoji font needed).
CHECK = "⚠ **Check this answer:**"


def _named(p: PassageEvidence) -> str:
    # The answer block keeps raw HTML (its cited sentences are spans), so a title from an uploaded corpus is escaped.
    return f"passage {p.position}, *{html.escape(p.passage.title or '(untitled)')}*"


def most_read(answer: Answer, view: ScoreView) -> PassageEvidence:
    """The passage with the highest score in the view shown (ties: the earlier one), as the shading shows it."""
    return answer.passages[passage_ranks(answer, view).index(1)]


def trust(answer: Answer, view: ScoreView) -> Trust:
    """The rule, from what the generator already computes (evidence per passage and the answer text):

    1. no answer text: nothing to trust;
    2. evidence flat (is_flat): the model did not clearly rely on any passage;
    3. a yes/no answer, or one that only repeats the question, has no words to look up in a passage;
    4. backed when at least half the answer's own words are in the passage read most; otherwise say where
       they are, if anywhere (nowhere: it may be made up).

    "Read most" follows the score view shown, so the verdict always names the passage shaded darkest.
    When the citations were checked (Generator.verify), a passing check outranks rules 2 to 4: removing the
    passage made the answer less likely, which is what "backed" means; a check where every citation failed is
    said after the verdict.

    An answer with a support score (`Answer.support`, generators.answering.support: calibrated on the train split, read
    from the answering pass and, once checked, from the citations' checks) gets the score's verdict instead: the rules
    above remain for answers without one (citations off).
    """
    if not answer.text.strip():
        return Trust(False, "⚠ **No answer:** the model wrote nothing. Try more passages or another method.")
    if not answer.passages:
        return Trust(False, f"{CHECK} no passage was given to the model.")
    if answer.support is not None:
        return _support_verdict(answer)
    checked = [s for c in answer.citations for s in c.sources if s.verified is not None]
    if any(s.verified for s in checked):
        return _checked_backing(answer, checked)
    verdict = _word_verdict(answer, view)
    if checked:  # all failed: the answer barely depends on what it cites
        note = " Removing the passages it cites barely changes the answer: it may come from the model's memory."
        return Trust(verdict.backed, verdict.text + note)
    return verdict


# The verdict's opening per band of the support score; what follows is the band's own words (BAND_WORDS).
SUPPORT_HEADS = {"likely": "✓ **Likely supported:**", "uncertain": "⚠ **Uncertain:**", "unlikely": CHECK}


def _support_verdict(answer: Answer) -> Trust:
    """The support score in words (`Support.plain`): how often answers scored like this one were right, where the
    support model was fitted on the method's answers (the score is calibrated, so that is what it means), or that
    this is not known for the method; then the passage the answer rests on."""
    support = answer.support
    said = support.plain(method_label(answer))
    cited = [s for c in (answer.withheld or {}).get("citations", answer.citations) for s in c.sources]
    rests = ""
    if cited:
        top = max(cited, key=lambda s: s.score)
        passage = next(p for p in answer.passages if p.position == top.position)
        rests = f" It rests on {_named(passage)}."
    withheld = "" if answer.withheld is None else f"; withheld: *{html.escape(answer.withheld['text'])}*"
    if not support.answered:  # the question again: no answer, whatever it cites
        return Trust(False, f"⚠ **No answer:** {said}{withheld}.")
    if withheld:
        return Trust(False, f"{CHECK} the passages do not seem to support an answer: {said}{withheld}.")
    if support.band not in SUPPORT_HEADS:  # given no passage: nothing to rest on
        return Trust(False, f"{CHECK} {said}.")
    # The band's words after its name ("uncertain: check it against the passages"), as the shells print them.
    rest = BAND_WORDS[support.band].partition(": ")[2]
    return Trust(support.band == "likely", f"{SUPPORT_HEADS[support.band]} {rest + '; ' if rest else ''}{said}.{rests}")


# A drop of ln(10) nats: the answer became at least ten times less likely without the passage.
MUCH_LESS_LIKELY = math.log(10)


def _checked_backing(answer: Answer, checked: list[CitedSource]) -> Trust:
    """The passing citation whose passage mattered most, in words."""
    best = max((s for s in checked if s.verified), key=lambda s: s.logprob_drop or 0.0)
    passage = next(p for p in answer.passages if p.position == best.position)
    how = "much less likely" if (best.logprob_drop or 0.0) >= MUCH_LESS_LIKELY else "less likely"
    return Trust(True, f"✓ **Backed:** removing {_named(passage)} makes this answer {how}.")


def _word_verdict(answer: Answer, view: ScoreView) -> Trust:
    """Rules 2 to 4 of `trust`."""
    top = most_read(answer, view)
    if is_flat(answer, view):
        runner_up = answer.passages[passage_ranks(answer, view).index(2)]
        return Trust(
            False,
            f"{CHECK} the model did not clearly rely on any passage: it read {_named(top)}, about as much as "
            f"{_named(runner_up)}.",
        )
    if re.match(r"\W*(yes|no)\b", answer.text.lower()):  # opens with it: "No evidence of X" is no yes/no answer
        return Trust(False, f"{CHECK} a yes/no answer has no words to find in a passage; read {_named(top)}.")
    words = answer_words(answer.text, answer.question)
    if not words:
        return Trust(False, f"{CHECK} it only repeats the question, so no passage can back it.")
    if contains_words(top.passage, words):
        return Trust(True, f"✓ **Backed by a passage:** the answer's words are in {_named(top)}, the one it read most.")
    holders = [p for p in answer.passages if contains_words(p.passage, words)]
    where = f"they are in {_named(holders[0])}, which it read less." if holders else "no passage has them."
    return Trust(False, f"{CHECK} the passage the model read most ({_named(top)}) lacks the answer's words; {where}")


def same_answer(text: str, known: list[str]) -> bool:
    """Loose match, as a reader would judge it: all the words of one answer are among the other's."""
    got = _words(text) - STOPWORDS
    return bool(got) and any((want := _words(k) - STOPWORDS) and (want <= got or got <= want) for k in known)


def answer_markdown(
    answer: Answer, view: ScoreView = "calibrated", known: list[str] | None = None, prefix: str = "m"
) -> str:
    """The first screen's account of one answer: the answer with its citation markers and their key, the
    passage read most, the trust verdict, and the dataset's answer when the question is an embedded example.
    `prefix` names this answer column in the ids its sentences cite (see passages_html)."""
    who = html.escape(f"{method_label(answer)}, {answer.model}")  # a model may be named by its folder's path
    # First: can the reader trust it (the support score's verdict), then what it cites.
    lines = [f"**Answer** ({who}): {cited_answer_html(answer, prefix)}", trust(answer, view).text]
    legend = citation_legend_html(answer)
    if legend:
        lines.append(legend)
    if answer.passages:
        lines.append(f"It read {_named(most_read(answer, view))}, the most.")
    if answer.restack is not None:
        held = ", ".join(f"[{n}]" for n in answer.restack["order"])
        lines.append(
            f"The passages were re-ordered before it answered, the most relevant first where this model reads best: "
            f"its prompt held {held}, in that order (numbers as listed below)."
        )
    if known:
        verdict = "same as this answer" if same_answer(answer.text, known) else "not this answer"
        lines.append(f"The dataset's answer to this example: *{html.escape(' / '.join(known))}* ({verdict}).")
    if answer.dropped:
        lines.append(f"{len(answer.dropped)} passages did not fit in the model's prompt and were left out.")
    return "\n\n".join(lines)


def details_markdown(answers: list[Answer]) -> str:
    """The Details panel's words for the numbers: what each score means, then per answer its sizes, timings and
    where its answer tokens looked."""
    cfg = answers[0].evidence_config
    layers = cfg.layers if isinstance(cfg.layers, str) else ",".join(map(str, cfg.layers))
    lines = [
        f"**evidence**: the attention a passage receives from the {cfg.query} tokens (layers: {layers}); "
        "**calibrated** subtracts what a content-free question gives the same prompt position, removing the pull "
        "of the prompt's start and end. **retrieval**: the retriever's similarity to the question. "
        "**attribution**: each passage's share of the answer tokens' attention. The shading uses the score "
        "view chosen above.",
    ]
    for a in answers:
        timing = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in a.timings.items())
        shares = attribution_shares(a)
        if shares is None:
            looked = "answer attribution: the answer is too short (one token or none) to attribute"
        else:
            top = sorted(range(len(shares)), key=lambda i: -shares[i])[:3]
            looked = "its tokens attended most to " + ", ".join(
                f"[{a.passages[i].position}] {a.passages[i].passage.title} {shares[i]:.0%}" for i in top
            )
        lines.append(
            f"**{method_label(a)}** ({a.model}): {a.prompt_tokens} prompt tokens, {a.generated_tokens} generated; "
            f"{timing}; {looked}."
        )
        if a.support is not None:  # as `midlens ask` prints it: the probability, its threshold, its calibration
            lines.append(f"support: {html.escape(a.support.words)}")
        lines += _citation_details(a)
    return "\n\n".join(lines)


def _citation_details(answer: Answer) -> list[str]:
    """Per answer sentence: each cited passage's share of the sentence's attention to passages, and, once
    checked, the log-probability the sentence lost without it (the check passes at CitationConfig.margin)."""
    lines = []
    for i, (citation, doubt) in enumerate(zip(answer.citations, doubted(answer), strict=True), start=1):
        cited = []
        for s in marker_order(citation.sources):
            outcome = CITE_LEGEND[CITE_CLASSES[citation_check(s, doubt)]]
            check = "" if s.logprob_drop is None else f", log-probability {-s.logprob_drop:+.2f} without it ({outcome})"
            cited.append(f"[{s.position}] {s.score:.0%} of its attention to passages{check}")
        lines.append(f"citations of sentence {i}: " + ("; ".join(cited) or "none"))
    return lines


def tracked_passages(answer: Answer, gold: list[str]) -> tuple[list[int], str]:
    """Prompt indices of the gold passages when any was retrieved, else of the top retrieved passage."""
    found = [i for i, p in enumerate(answer.passages) if p.passage.title in gold]
    if found:
        return found, "gold"
    return [0], "top retrieved"


@dataclass
class Comparison:
    """Rows of the gold/top summary: one per tracked passage, one rank per method."""

    kind: str
    rows: list[dict]


def comparison(answers: list[Answer], view: ScoreView, gold: list[str]) -> Comparison:
    first = answers[0]
    indices, kind = tracked_passages(first, gold)
    ranks_by_method = {method_label(a): passage_ranks(a, view) for a in answers}
    rows = []
    for i in indices:
        p = first.passages[i]
        row = {"passage": p.passage.title, "position": p.position}
        row.update({f"rank under {m}": r[i] for m, r in ranks_by_method.items()})
        rows.append(row)
    return Comparison(kind, rows)


def comparison_markdown(answers: list[Answer], view: ScoreView, gold: list[str]) -> str:
    comp = comparison(answers, view, gold)
    methods = [method_label(a) for a in answers]
    n = len(answers[0].passages)
    head = (
        f"**Evidence rank of the {comp.kind} passage** ({view} scores; 1 = strongest of {n})"
        if comp.kind == "gold"
        else f"**Evidence rank of the top retrieved passage** (no gold label for this question; {view} scores)"
    )
    table = ["| passage | prompt position | " + " | ".join(f"rank under {m}" for m in methods) + " |"]
    table.append("|---|---|" + "---|" * len(methods))
    for row in comp.rows:
        cells = [str(row[f"rank under {m}"]) for m in methods]
        table.append(f"| {row['passage']} | {row['position']} | " + " | ".join(cells) + " |")
    return head + "\n\n" + "\n".join(table)


def evidence_table(answers: list[Answer], view: ScoreView) -> pd.DataFrame:
    """One row per passage in prompt order; per method: evidence in the chosen view, its rank, attribution."""
    first = answers[0]
    data: dict[str, list] = {
        "position": [p.position for p in first.passages],
        "title": [p.passage.title for p in first.passages],
        "retrieval": [None if p.retrieval_score is None else round(p.retrieval_score, 4) for p in first.passages],
    }
    for a in answers:
        m = method_label(a)
        values = scores(a, view)
        shares = attribution_shares(a)
        data[f"{m} evidence"] = [round(v, 5) for v in values]
        data[f"{m} rank"] = passage_ranks(a, view)
        data[f"{m} attribution"] = [None] * len(values) if shares is None else [round(s, 3) for s in shares]
    return pd.DataFrame(data)


def position_frame(answers: list[Answer], view: ScoreView) -> pd.DataFrame:
    """Long format for gr.LinePlot: evidence against prompt position, one line per method.

    Positions are strings so the axis is categorical (whole positions only, no 1.4 ticks).
    """
    rows = [
        {"position": str(p.position), "evidence": v, "method": method_label(a)}
        for a in answers
        for p, v in zip(a.passages, scores(a, view), strict=True)
    ]
    return pd.DataFrame(rows, columns=["position", "evidence", "method"])


def attribution_frame(answer: Answer) -> pd.DataFrame:
    shares = attribution_shares(answer) or [0.0] * len(answer.passages)
    rows = [
        {"position": str(p.position), "passage": p.passage.title, "share": s}
        for p, s in zip(answer.passages, shares, strict=True)
    ]
    return pd.DataFrame(rows, columns=["position", "passage", "share"])


EVIDENCE_AXIS_TITLES = {"calibrated": "calibrated evidence", "raw": "evidence (attention share)"}


HEADROOM = 1.1  # the tallest point or bar stays clear of the plot's top edge


def evidence_limits(answers: list[Answer], view: ScoreView) -> list[float]:
    """y-axis limits for the position plot that always include zero: raw evidence is a share, and an axis
    starting at 0.010 makes a 0.015 vs 0.060 difference look like 1 to 50. Calibrated scores can dip below 0."""
    values = [v for a in answers for v in scores(a, view)]
    lo, hi = min(0.0, *values) * HEADROOM, max(0.0, *values) * HEADROOM
    return [lo, hi if hi > lo else lo + 1.0]


def share_limits(answer: Answer) -> list[float]:
    """y-axis limits for the attribution bars: from zero (bars compare by length) to just above the largest."""
    top = max(attribution_frame(answer)["share"], default=0.0)
    return [0.0, top * HEADROOM if top > 0 else 1.0]


# Columns of the scores table as shares of its width, wide enough for each header's longest word at 1280 px
# (a header that does not fit is broken mid-word: "positi|on"); the title column takes what is left.
FIXED_COLUMNS = {"position": 9.0, "retrieval": 9.5}
METHOD_COLUMNS = {"evidence": 9.5, "rank": 9.0, "attribution": 11.0}


def table_column_widths(methods: int) -> list[str]:
    """Widths for evidence_table's columns, in its column order."""
    per_method = list(METHOD_COLUMNS.values())
    title = 100.0 - sum(FIXED_COLUMNS.values()) - methods * sum(per_method)
    widths = [FIXED_COLUMNS["position"], title, FIXED_COLUMNS["retrieval"], *per_method * methods]
    return [f"{w:g}%" for w in widths]
