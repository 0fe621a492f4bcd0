"""Prototype: one worked example (a train-split two-hop question, not in the tuning copy) before the documents.
Resumable.

    python docs/results/answer-path/fourth-round/one_shot.py qwen2.5-0.5b OUT.jsonl I/N \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5

Why: the reader often answers with a sentence or with the wrong entity of two hops; one demonstration of
"follow the bridge entity, answer with the final one" costs ~120 prompt tokens per question.
"""

import json
import sys
import time
from pathlib import Path

import generators.prompt as P
from eval.datasets import load_questions
from eval.metrics import answer_f1, best_subspan_em
from rag.pipeline import Pipeline

# HotpotQA train split, id 5abd94525542992ac4f382d2 (the two supporting paragraphs, first sentences).
EXAMPLE = (
    "Example:\n"
    "Document [1](Title: 2014 S/S) 2014 S/S is the debut album of South Korean group WINNER. It was released on "
    "August 12, 2014 by the group's record label, YG Entertainment.\n"
    "Document [2](Title: Winner (band)) Winner, often stylized as WINNER, is a South Korean boy group formed in "
    "2013 by YG Entertainment and debuted in 2014.\n"
    "Question: 2014 S/S is the debut album of a South Korean boy group that was formed by who?\n"
    "Answer: YG Entertainment\n\n"
    "Now the real documents and question.\n\n"
)
_original = P._user_content


# An experiment, not a feature: the example goes between the instruction and the documents, and every span the
# library computed is shifted by its length, so fitting and evidence stay the library's own.
def user_content(passages, question, style):
    content, spans, q = _original(passages, question, style)
    cut = len(P.STYLES[style]) + 2
    shift = len(EXAMPLE)
    content = content[:cut] + EXAMPLE + content[cut:]
    return content, [(s + shift, e + shift) for s, e in spans], (q[0] + shift, q[1] + shift)


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
