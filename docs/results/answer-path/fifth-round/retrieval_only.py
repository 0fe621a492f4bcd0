"""Retrieval alone, per retrieval name: share of gold paragraphs in the top k, questions with every gold paragraph,
and ms per query (median of 5 passes, with the ratio to dense measured in the same run).

OMP_NUM_THREADS=2 python docs/results/answer-path/fifth-round/retrieval_only.py [QUESTIONS CORPUS INDEX_DIR]
(default: the 40 embedded questions and their corpus, in the shared index cache)."""

import json
import statistics
import sys
import time

from midlens.retrievers.build import build_retriever
from midlens.retrievers.corpus import default_corpus_path, default_questions_path

questions_path, corpus, index_dir = sys.argv[1:4] if len(sys.argv) > 3 else (default_questions_path(), None, None)
questions = [json.loads(line) for line in open(questions_path)]
K = 5
NAMES = ("dense", "hybrid", "dense+links", "hybrid+links")
retrievers = {name: build_retriever(corpus or default_corpus_path(), name, index_dir=index_dir) for name in NAMES}


def one_pass(retriever) -> float:
    t0 = time.perf_counter()
    for q in questions:
        retriever.search(q["question"], K)
    return (time.perf_counter() - t0) / len(questions) * 1000


# Warm every retriever once, then time them in turn, 5 rounds: load on the machine falls on all of them alike.
for r in retrievers.values():
    one_pass(r)
passes = {name: [] for name in NAMES}
for _ in range(5):
    for name, r in retrievers.items():
        passes[name].append(one_pass(r))
ms = {name: statistics.median(v) for name, v in passes.items()}
for name, retriever in retrievers.items():
    share = both = 0.0
    for q in questions:
        gold = {t.lower() for t in q["gold_titles"]}
        found = gold & {p.title.lower() for p in retriever.search(q["question"], K)}
        share += len(found) / len(gold)
        both += found == gold
    print(
        f"{name:<13} gold paragraphs {100 * share / len(questions):5.1f} %  questions with both "
        f"{100 * both / len(questions):5.1f} %  {ms[name]:6.2f} ms/query ({ms[name] / ms['dense']:.2f}x dense)"
    )
