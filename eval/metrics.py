"""Answer and ranking metrics, as the lost-in-the-middle and SQuAD evaluation scripts define them.

Answers: SQuAD normalisation (lowercase, punctuation and the articles a/an/the removed, whitespace
collapsed); accuracy is `best_subspan_em` on the FIRST line of the output (Liu et al. 2023: a normalised
gold answer occurs inside the normalised prediction); F1 is SQuAD's token-overlap F1, best over aliases.
Rankings: binary relevance over passage ids; Recall@k is the share of gold passages in the top k.
Uncertainty: 95 % bootstrap intervals over questions (scipy.stats.bootstrap, percentile method); at
n = 200 an accuracy cell near 50 % spans about +-7 points, wider than many differences it is read for.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.stats import bootstrap

from midlens.core.answer_text import normalize_answer


def first_line(prediction: str) -> str:
    """The first non-empty line: models continue with a second 'question' that must not count."""
    for line in prediction.strip().splitlines():
        if line.strip():
            return line
    return ""


def best_subspan_em(prediction: str, answers: Iterable[str]) -> float:
    pred = normalize_answer(first_line(prediction))
    for answer in answers:
        gold = normalize_answer(answer)
        if gold and gold in pred:
            return 1.0
    return 0.0


def token_f1(prediction: str, answer: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(answer).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def answer_f1(prediction: str, answers: Iterable[str]) -> float:
    """Best SQuAD F1 over the gold aliases, on the first line of the prediction."""
    line = first_line(prediction)
    return max((token_f1(line, a) for a in answers), default=0.0)


def recall_at_k(ranked: Sequence[str], gold: set[str], k: int) -> float:
    if not gold:
        raise ValueError("recall_at_k needs at least one gold id.")
    return len(set(ranked[:k]) & gold) / len(gold)


def mrr(ranked: Sequence[str], gold: set[str]) -> float:
    for i, pid in enumerate(ranked, start=1):
        if pid in gold:
            return 1.0 / i
    return 0.0


def ndcg_at_k(ranked: Sequence[str], gold: set[str], k: int = 10) -> float:
    dcg = sum(1.0 / math.log2(i + 1) for i, pid in enumerate(ranked[:k], start=1) if pid in gold)
    ideal = sum(1.0 / math.log2(i + 1) for i in range(1, min(len(gold), k) + 1))
    return dcg / ideal if ideal else 0.0


def ranking_metrics(ranked: Sequence[str], gold: set[str]) -> dict[str, float]:
    return {
        "recall@1": recall_at_k(ranked, gold, 1),
        "recall@2": recall_at_k(ranked, gold, 2),
        "recall@5": recall_at_k(ranked, gold, 5),
        "mrr": mrr(ranked, gold),
        "ndcg@10": ndcg_at_k(ranked, gold, 10),
    }


BOOTSTRAP_RESAMPLES = 2000


def ratio_ci(
    numerators: Sequence[float], denominators: Sequence[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(numerators) / mean(denominators), resampling the pairs together (one
    per answer: e.g. a ranking's log-probability drop against the reference's on the same answer)."""
    a, b = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if a.size != b.size:
        raise ValueError(f"{a.size} numerators but {b.size} denominators: one pair per unit.")
    if a.size < 2:
        return float("nan"), float("nan")
    res = bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x, axis=axis) / np.mean(y, axis=axis),
        paired=True,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean over `values` (one per question); (nan, nan) when empty."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return float("nan"), float("nan")
    if data.size == 1 or np.all(data == data[0]):  # no spread to resample: the interval is the point
        return float(data[0]), float(data[0])
    res = bootstrap(
        (data,),
        np.mean,
        confidence_level=confidence,
        n_resamples=BOOTSTRAP_RESAMPLES,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
