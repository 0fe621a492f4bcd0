"""End to end over a corpus: question -> Pipeline.ask (retrieve top-k, generate) -> EM/F1, and, when the
question names its gold passages by title, how many the retriever found and how many the evidence
ranks in its top 2."""

from __future__ import annotations

import time

from midlens.core.batch_size import BatchSize
from midlens.eval.metrics import answer_f1, best_subspan_em
from midlens.rag.pipeline import Pipeline


def evaluate_e2e(pipe: Pipeline, question: dict) -> dict:
    t0 = time.perf_counter()
    answer = pipe.ask(question["question"])
    return {**row_of(question, answer), "seconds": time.perf_counter() - t0}


def evaluate_e2e_many(pipe: Pipeline, questions: list[dict], batch_size: BatchSize) -> list[dict]:
    """Rows for many questions, answered in batches; "seconds" is each question's share of the wall time."""
    t0 = time.perf_counter()
    answers = pipe.ask_many([q["question"] for q in questions], batch_size)
    seconds = (time.perf_counter() - t0) / max(1, len(questions))
    return [{**row_of(q, a), "seconds": seconds} for q, a in zip(questions, answers, strict=True)]


def row_of(question: dict, answer) -> dict:
    row = {
        "prediction": answer.text,
        "em": best_subspan_em(answer.text, question["answers"]),
        "f1": answer_f1(answer.text, question["answers"]),
        "retrieved": [p.passage.title for p in answer.passages],
    }
    gold = set(question.get("gold_titles") or [])
    if gold:
        ranked = [p.passage.title for p in answer.ranked()]
        row["retrieval_recall"] = len(gold & set(row["retrieved"])) / len(gold)
        row["evidence_recall@2"] = len(gold & set(ranked[:2])) / len(gold)
    return row
