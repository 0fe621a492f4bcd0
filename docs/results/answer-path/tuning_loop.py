"""The loop every answer-path prototype shares: answer each tuning question one way, append a row, resume.

A prototype script calls `run(answer)` with `answer(pipe, question) -> Answer`; the command line is the same for
all of them:

    python docs/results/answer-path/ROUND/SCRIPT.py MODEL OUT.jsonl I/N QUESTIONS CORPUS INDEX_DIR

Rows: {"id", "pred", "em", "f1", "s"} per question, appended and flushed, so a killed run resumes where it stopped.
"""

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from midlens.eval.datasets import load_questions
from midlens.eval.metrics import answer_f1, best_subspan_em
from midlens.generators.answering.answer import Answer
from midlens.rag.pipeline import Pipeline


def run(answer: Callable[[Pipeline, str], Answer]) -> None:
    model, out, shard = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    i, n = map(int, shard.split("/"))
    qs = load_questions(sys.argv[4])[i::n]
    pipe = Pipeline.from_corpus(sys.argv[5], model=model, index_dir=sys.argv[6], restack=None)
    done = {json.loads(line)["id"] for line in out.open()} if out.exists() else set()
    for q in qs:
        if q["id"] in done:
            continue
        t0 = time.perf_counter()
        ans = answer(pipe, q["question"])
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
