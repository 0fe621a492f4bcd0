"""Prototype: stack the retrieved passages best-LAST, next to the question, instead of best-first. Resumable.

    python docs/results/answer-path/fourth-round/passage_order.py qwen2.5-0.5b OUT.jsonl I/N \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5

Why: small readers lean on what is nearest the question (recency); with best-first order the top passage
is the farthest from it. Same retrieval, instruction, 48 new tokens and metrics as `midlens eval e2e`.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuning_loop.py, one folder up

from tuning_loop import run  # noqa: E402

# The retriever's top k, best passage last, then the library's own prompt and generation.
run(lambda pipe, question: pipe.answer(question, pipe.retrieve(question)[::-1], calibrate=False))
