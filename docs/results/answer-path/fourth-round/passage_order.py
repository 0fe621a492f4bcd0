"""Prototype: stack the retrieved passages best-LAST, next to the question, instead of best-first. Resumable.

    python docs/results/answer-path/fourth-round/passage_order.py qwen2.5-0.5b OUT.jsonl I/N \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5

Why: small readers lean on what is nearest the question (recency); with best-first order the top passage
is the farthest from it. Same retrieval, instruction, 48 new tokens and metrics as `midlens eval e2e`.
"""

import json
import sys
import time
from pathlib import Path

from eval.datasets import load_questions
from eval.metrics import answer_f1, best_subspan_em
from rag.pipeline import Pipeline

model, out, shard = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
i, n = map(int, shard.split("/"))
qs = load_questions(sys.argv[4])[i::n]
pipe = Pipeline.from_corpus(sys.argv[5], model=model, index_dir=sys.argv[6])
done = {json.loads(line)["id"] for line in out.open()} if out.exists() else set()
for q in qs:
    if q["id"] in done:
        continue
    t0 = time.perf_counter()
    passages = pipe.retrieve(q["question"])
    ans = pipe.answer(q["question"], passages[::-1], calibrate=False)
    row = {
        "id": q["id"],
        "pred": ans.text,
        "em": best_subspan_em(ans.text, q["answers"]),
        "f1": answer_f1(ans.text, q["answers"]),
        "s": time.perf_counter() - t0,
    }
    with out.open("a") as h:
        h.write(json.dumps(row) + "\n")
    print(row["em"], row["pred"][:60], flush=True)
