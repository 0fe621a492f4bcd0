"""Attention evidence as a reranker: rank an example's passages by raw and calibrated evidence and
compare with the dense retriever's order and BM25 (bm25s), on examples with known gold passages.

The prompt stacks the passages in dense order, as a RAG pipeline would hand them over; one scoring
pass (no decoding) gives the evidence, so the reranker costs one prefill plus the calibration suffix.
"""

from __future__ import annotations

import time

from midlens.eval.datasets import Example
from midlens.eval.metrics import ranking_metrics
from midlens.eval.sweep import dense_scores
from midlens.generators.generator import Generator
from midlens.generators.prompt import DEFAULT_STYLE
from midlens.retrievers.lexical import bm25_scores


def _ranked(ids: list[str], scores: list[float]) -> list[str]:
    # Stable on ties: equal scores keep the input (dense) order.
    return [ids[i] for i in sorted(range(len(ids)), key=lambda i: -scores[i])]


def evaluate_rerank(gen: Generator, example: Example, max_new_tokens: int = 0, style: str = DEFAULT_STYLE) -> dict:
    t0 = time.perf_counter()
    dense = dense_scores(example.question, example.passages)
    order = sorted(range(len(example.passages)), key=lambda i: -dense[i])
    passages = [example.passages[i] for i in order]
    ids = [p.id for p in passages]
    answer = gen.score(gen.prompt(example.question, passages, max_new_tokens=max_new_tokens, style=style))
    gold = set(example.gold_ids)
    rankings = {
        "dense": ids,
        "bm25": _ranked(ids, bm25_scores(example.question, passages)),
        "evidence_raw": _ranked(ids, [p.evidence for p in answer.passages]),
        "evidence_calibrated": _ranked(ids, [p.calibrated for p in answer.passages]),
    }
    return {
        "rankers": {name: ranking_metrics(ranked, gold) for name, ranked in rankings.items()},
        "seconds": time.perf_counter() - t0,
    }
