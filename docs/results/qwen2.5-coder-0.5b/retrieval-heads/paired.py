"""Paired difference of evidence reranking between two `midlens eval rerank` runs of the same questions.

python docs/results/qwen2.5-coder-0.5b/retrieval-heads/paired.py RUN_A RUN_B   # B minus A, per ranker and metric
"""

from __future__ import annotations

import sys
from pathlib import Path

from midlens.eval.metrics import bootstrap_ci
from midlens.eval.runner import read_rows


def main(run_a: str, run_b: str) -> None:
    a, b = ({r["example_id"]: r["rankers"] for r in read_rows(Path(run) / "results.jsonl")} for run in (run_a, run_b))
    common = sorted(set(a) & set(b))
    print(f"{len(common)} questions in both runs; B minus A, mean [95 % bootstrap interval]")
    for ranker in ("evidence_raw", "evidence_calibrated"):
        for metric in ("recall@1", "recall@2", "recall@5", "mrr"):
            diffs = [b[q][ranker][metric] - a[q][ranker][metric] for q in common]
            lo, hi = bootstrap_ci(diffs)
            print(f"{ranker:<20} {metric:<9} {sum(diffs) / len(diffs):+.3f} [{lo:+.3f}, {hi:+.3f}]")


if __name__ == "__main__":
    main(*sys.argv[1:3])
