"""The citation rule: which passages an answer sentence cites, from its attention shares and the prompt's evidence.

One module for the library (generators.answering.citations) and the `eval cite` report (eval.report.cite): the report
re-applies a rule to stored rows without the model, so the rule it measures must be the one the library applies,
not a copy that can drift. No torch here: the report and the command-line parser import it.
"""

from __future__ import annotations

from collections.abc import Sequence


def evidence_shares(evidence: Sequence[float]) -> list[float] | None:
    """The prompt's passage evidence (`PassageEvidence.score`, calibrated when it was) as shares summing to 1.
    Calibrated evidence is score minus a content-free query's score, so it can be negative: a passage the question
    attends less than "N/A" does has no share. None when no passage has positive evidence (nothing to blend in)."""
    clipped = [max(float(e), 0.0) for e in evidence]
    total = sum(clipped)
    return [e / total for e in clipped] if total > 0 else None


def citation_scores(
    answer_shares: Sequence[float],
    evidence: Sequence[float] | None,
    evidence_weight: float,
    raw_evidence: Sequence[float] | None = None,
    raw_evidence_weight: float = 0.0,
) -> list[float]:
    """Each passage's citation score for one answer sentence: w * its share of the prompt's calibrated evidence
    + r * its share of the prompt's raw evidence + (1 - w - r) * its share of the sentence's attention to passages,
    w = `evidence_weight`, r = `raw_evidence_weight`.

    Why the blend: the answer's attention share carries the model's position bias (on the HotpotQA train split,
    SmolLM2-135M gives the last of 10 slots 27 % of an answer sentence's passage attention on average, a middle
    slot 5-7 %), while calibrated evidence has a content-free query's attention subtracted, which removes that
    prior. Raw evidence keeps the prior but ranks the supporting paragraphs better on its own for trained deltas
    (docs/results/cite/README.md, section 11). Evidence that is not given, or has no positive value, hands its
    weight to the answer share (with none, the answer share is the score alone)."""
    if evidence_weight + raw_evidence_weight > 1 + 1e-9:
        raise ValueError(f"evidence weights {evidence_weight} + {raw_evidence_weight} exceed 1.")
    score = [0.0] * len(answer_shares)
    answer_weight = 1.0
    for values, weight in ((evidence, evidence_weight), (raw_evidence, raw_evidence_weight)):
        shares = None if values is None or weight == 0 else evidence_shares(values)
        if shares is None:
            continue
        if len(shares) != len(answer_shares):
            raise ValueError(f"{len(answer_shares)} answer shares but {len(shares)} evidence scores: one per passage.")
        score = [x + weight * e for x, e in zip(score, shares, strict=True)]
        answer_weight -= weight
    return [x + answer_weight * float(a) for x, a in zip(score, answer_shares, strict=True)]


def apply_rule(scores: Sequence[float], max_sources: int, min_share: float) -> list[int]:
    """The 1-based positions cited: at most `max_sources` of the top-scored, each at least `min_share` of the top
    score, strongest first. Scores all zero (nothing attended, nothing matched) cite nothing."""
    total = sum(max(s, 0.0) for s in scores)
    if total <= 0:
        return []
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    top = scores[order[0]]
    return [i + 1 for i in order[:max_sources] if scores[i] >= min_share * top]
