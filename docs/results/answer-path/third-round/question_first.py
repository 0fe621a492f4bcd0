"""Prototype: the question also before the documents (Liu et al.'s query-aware contextualization). Resumable.

    python docs/results/answer-path/third-round/question_first.py qwen2.5-0.5b OUT.jsonl I/2 \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5
"""

import json
import sys
import time
from pathlib import Path

import generators.prompt as P
from eval.datasets import load_questions
from eval.metrics import answer_f1, best_subspan_em
from rag.pipeline import Pipeline


# An experiment, not a feature: it swaps the private layout function of generators.prompt for one with the
# question written twice, so spans, fitting and evidence stay the library's own.
def user_content(passages, question, style):
    instruction = P.STYLES[P.check_style(style)]
    head = f"{instruction}\n\nQuestion: {question}\n\n"
    parts, pos, spans = [head], len(head), []
    for i, passage in enumerate(passages, start=1):
        line = P.render_document(i, passage)
        spans.append((pos, pos + len(line)))
        parts += [line, "\n"]
        pos += len(line) + 1
    parts.append("\nQuestion: ")
    pos += len("\nQuestion: ")
    q = (pos, pos + len(question))
    parts += [question, "\nAnswer:"]
    return "".join(parts), spans, q


P._user_content = user_content

model, out, shard = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
i, n = map(int, shard.split("/"))
qs = load_questions(sys.argv[4])[i::n]
pipe = Pipeline.from_corpus(sys.argv[5], model=model, index_dir=sys.argv[6])
done = {json.loads(line)["id"] for line in out.open()} if out.exists() else set()
for q in qs:
    if q["id"] in done:
        continue
    t0 = time.perf_counter()
    ans = pipe.ask(q["question"], calibrate=False)
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
