"""Prototype: answer from the passages the evidence ranks highest (tuning copy, train split). Resumable.

python docs/results/answer-path/third-round/focus_by_evidence.py qwen2.5-0.5b OUT.jsonl I/2
"""

import json
import sys
import time
from pathlib import Path

from midlens.eval.datasets import load_questions
from midlens.eval.metrics import answer_f1, best_subspan_em
from midlens.rag.pipeline import Pipeline

model, out = sys.argv[1], Path(sys.argv[2])
shard, shards = map(int, sys.argv[3].split("/"))
variants = [(5, 2), (10, 2), (10, 3)]
qs = load_questions("runs/tune-e2e/hotpotqa_questions.jsonl")[shard::shards]
pipe = Pipeline.from_corpus(
    "runs/tune-e2e/hotpotqa_corpus.jsonl", model=model, index_dir="runs/tune-e2e/index-dense10", restack=None
)
done = {json.loads(line)["id"] for line in out.open()} if out.exists() else set()
for q in qs:
    if q["id"] in done:
        continue
    row = {"id": q["id"]}
    ranked10 = pipe.retrieve(q["question"], 10)
    for k, f in variants:
        t0 = time.perf_counter()
        cands = ranked10[:k]
        scored = pipe.generator.score(pipe.generator.prompt(q["question"], cands, max_new_tokens=48))
        keep = sorted(p.position for p in scored.passages if p.rank <= f)
        chosen = [cands[i - 1] for i in keep]
        ans = pipe.answer(q["question"], chosen, calibrate=False)
        row[f"k{k}f{f}"] = {
            "pred": ans.text,
            "em": best_subspan_em(ans.text, q["answers"]),
            "f1": answer_f1(ans.text, q["answers"]),
            "kept": [p.title for p in chosen],
            "gold_kept": len(set(q["gold_titles"]) & {p.title for p in chosen}),
            "s": time.perf_counter() - t0,
        }
    with out.open("a") as h:
        h.write(json.dumps(row) + "\n")
    print(len(done) + 1, {v: row[v]["em"] for v in row if v != "id"}, flush=True)
    done.add(q["id"])
