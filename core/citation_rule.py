"""The citation rule: which passages an answer sentence cites, from its attention shares and the prompt's evidence.

One module for the library (generators.citations) and the `eval cite` report (eval.report.cite): the report
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
    answer_shares: Sequence[float], evidence: Sequence[float] | None, evidence_weight: float
) -> list[float]:
    """Each passage's citation score for one answer sentence: (1 - w) * its share of the sentence's attention to
    passages + w * its share of the prompt's evidence, w = `evidence_weight`.

    Why the blend: the answer's attention share carries the model's position bias (on the HotpotQA train split,
    SmolLM2-135M gives the last of 10 slots 27 % of an answer sentence's passage attention on average, a middle
    slot 5-7 %), while calibrated evidence has a content-free query's attention subtracted, which removes that
    prior. Without evidence (none given, or none positive) the answer share is the score alone."""
    shares = None if evidence is None or evidence_weight == 0 else evidence_shares(evidence)
    if shares is None:
        return [float(a) for a in answer_shares]
    if len(shares) != len(answer_shares):
        raise ValueError(f"{len(answer_shares)} answer shares but {len(shares)} evidence scores: one per passage.")
    return [(1 - evidence_weight) * a + evidence_weight * e for a, e in zip(answer_shares, shares, strict=True)]


def apply_rule(scores: Sequence[float], max_sources: int, min_share: float) -> list[int]:
    """The 1-based positions cited: at most `max_sources` of the top-scored, each at least `min_share` of the top
    score, strongest first. Scores all zero (nothing attended, nothing matched) cite nothing."""
    total = sum(max(s, 0.0) for s in scores)
    if total <= 0:
        return []
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    top = scores[order[0]]
    return [i + 1 for i in order[:max_sources] if scores[i] >= min_share * top]
