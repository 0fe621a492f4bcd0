"""Answer records -> what the demo page shows. Pure functions: no Gradio, no model, easy to test.

Scores shown on the heat scale are normalised per answer (divided by the largest |score| among its
passages) because Gradio's HighlightedText maps a float label to opacity, so it needs [-1, 1].
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import pandas as pd

from midlens.generators.evidence import Answer, PassageEvidence
from midlens.retrievers.corpus import default_questions_path

ScoreView = Literal["calibrated", "raw"]
SCORE_VIEWS: tuple[str, ...] = ("calibrated", "raw")

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
EXAMPLE_NOTES = {
    MID_PROMPT_EXAMPLE_ID: "gold passage mid-prompt (position 3 of 5)",
    "5ae72c1e554299572ea54754": "gold passage first",
    LINKED_EXAMPLE_ID: "gold passage found by a link (position 3)",
    "5a70f4695542994082a3e435": "two gold passages",
}


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


def method_label(answer: Answer) -> str:
    return answer.method.get("name", "?")


def scores(answer: Answer, view: ScoreView) -> list[float]:
    """One score per passage in prompt order; calibrated falls back to raw when calibration did not run."""
    if view not in SCORE_VIEWS:
        raise ValueError(f"score view {view!r}: choose one of {', '.join(SCORE_VIEWS)}.")
    if view == "calibrated" and all(p.calibrated is not None for p in answer.passages):
        return [float(p.calibrated) for p in answer.passages]
    return [float(p.evidence) for p in answer.passages]


def ranks(values: list[float]) -> list[int]:
    """1 = largest value; ties keep prompt order."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    for r, i in enumerate(order, start=1):
        out[i] = r
    return out


def normalised(values: list[float]) -> list[float]:
    top = max((abs(v) for v in values), default=0.0)
    return [0.0 if top == 0 else v / top for v in values]


def _passage_header(p: PassageEvidence, score: float, rank: int, n: int, gold: bool) -> str:
    ret = "-" if p.retrieval_score is None else f"{p.retrieval_score:.3f}"
    mark = "  ★ gold" if gold else ""
    title = p.passage.title or "(untitled)"
    via = p.passage.metadata.get("linked_from")
    title += f"  ·  named by {via}" if via else ""
    return f"[{p.position}] {title}  ·  retrieval {ret}  ·  evidence {score:+.4f} (rank {rank}/{n}){mark}\n"


def highlighted(answer: Answer, view: ScoreView, gold: list[str] | None = None) -> list[tuple[str, float | None]]:
    """Passages in prompt order for gr.HighlightedText: a plain header line, then the text on the heat scale."""
    values = scores(answer, view)
    heat = normalised(values)
    rank = ranks(values)
    n = len(values)
    gold = gold or []
    segments: list[tuple[str, float | None]] = []
    for p, v, h, r in zip(answer.passages, values, heat, rank, strict=True):
        segments.append((_passage_header(p, v, r, n, p.passage.title in gold), None))
        segments.append((" ".join(p.passage.text.split()) + "\n", round(h, 4)))
    return segments


def attribution_shares(answer: Answer) -> list[float] | None:
    """The answer tokens' attention per passage as shares summing to 1 (None when too short to attribute)."""
    raw = [p.answer_attribution for p in answer.passages]
    if not raw or any(v is None for v in raw):
        return None
    total = sum(max(0.0, v) for v in raw)
    return [0.0 if total == 0 else max(0.0, v) / total for v in raw]


def answer_markdown(answer: Answer) -> str:
    text = answer.text or "(the model produced no answer text)"
    lines = [f"**{method_label(answer)}** ({answer.model}): {text}"]
    shares = attribution_shares(answer)
    if shares is None:
        lines.append("Answer attribution: the answer is too short (one token or none) to attribute.")
    else:
        top = sorted(range(len(shares)), key=lambda i: -shares[i])[:3]
        parts = [f"[{answer.passages[i].position}] {answer.passages[i].passage.title} {shares[i]:.0%}" for i in top]
        lines.append("Its tokens attended most to: " + ", ".join(parts))
    timing = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in answer.timings.items())
    lines.append(f"{answer.prompt_tokens} prompt tokens, {answer.generated_tokens} generated; {timing}")
    if answer.dropped:
        lines.append(f"{len(answer.dropped)} passages did not fit the context window and were left out.")
    return "\n\n".join(lines)


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
    ranks_by_method = {method_label(a): ranks(scores(a, view)) for a in answers}
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
        data[f"{m} rank"] = ranks(values)
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
