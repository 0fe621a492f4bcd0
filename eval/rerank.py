"""Attention evidence as a reranker: rank an example's passages by raw and calibrated evidence and
compare with the dense retriever's order and BM25 (bm25s), on examples with known gold passages.

The prompt stacks the passages in dense order, as a RAG pipeline would hand them over; one scoring
pass (no decoding) gives the evidence, so the reranker costs one prefill plus the calibration suffix.
"""

from __future__ import annotations

import time

from midlens.core.batch_size import BatchSize
from midlens.eval.datasets import Example
from midlens.eval.metrics import ranking_metrics
from midlens.eval.sweep import dense_scores
from midlens.generators.answering.generator import Generator
from midlens.generators.answering.scheduling import generate_all
from midlens.generators.models.prompt import DEFAULT_STYLE
from midlens.retrievers.lexical import bm25_scores


def _ranked(ids: list[str], scores: list[float]) -> list[str]:
    # Stable on ties: equal scores keep the input (dense) order.
    return [ids[i] for i in sorted(range(len(ids)), key=lambda i: -scores[i])]


def evaluate_rerank(gen: Generator, example: Example, max_new_tokens: int = 0, style: str = DEFAULT_STYLE) -> dict:
    return evaluate_rerank_many(gen, [example], 1, max_new_tokens, style)[0]


def evaluate_rerank_many(
    gen: Generator,
    examples: list[Example],
    batch_size: BatchSize = 1,
    max_new_tokens: int = 0,
    style: str = DEFAULT_STYLE,
) -> list[dict]:
    """Rows for many examples, their scoring passes run `batch_size` at a time; "seconds" is each one's share."""
    t0 = time.perf_counter()
    stacked = []
    for example in examples:
        dense = dense_scores(example.question, example.passages)
        order = sorted(range(len(example.passages)), key=lambda i: -dense[i])
        stacked.append([example.passages[i] for i in order])
    prompts = [
        gen.prompt(ex.question, passages, max_new_tokens=max_new_tokens, style=style)
        for ex, passages in zip(examples, stacked, strict=True)
    ]
    answers = generate_all(gen, prompts, batch_size, max_new_tokens=0)
    seconds = (time.perf_counter() - t0) / max(1, len(examples))
    rows = []
    for example, passages, answer in zip(examples, stacked, answers, strict=True):
        ids = [p.id for p in passages]
        rankings = {
            "dense": ids,
            "bm25": _ranked(ids, bm25_scores(example.question, passages)),
            "evidence_raw": _ranked(ids, [p.evidence for p in answer.passages]),
            "evidence_calibrated": _ranked(ids, [p.calibrated for p in answer.passages]),
        }
        gold = set(example.gold_ids)
        rows.append({"rankers": {name: ranking_metrics(r, gold) for name, r in rankings.items()}, "seconds": seconds})
    return rows
