"""Answers of the default model (Qwen2.5-0.5B, top 5, 48 tokens) on the README's and the demo's example
questions, per retrieval (default: dense hybrid dense+links). Run:
OMP_NUM_THREADS=1 python docs/results/answer-path/examples_check.py [RETRIEVAL ...] >> examples.jsonl"""

import json
import sys

from midlens.demo.views import example_questions
from midlens.generators.answering.generator import Generator
from midlens.rag.pipeline import Pipeline
from midlens.retrievers.build import build_retriever
from midlens.retrievers.corpus import default_corpus_path, default_questions_path

answers = {json.loads(line)["question"].strip(): json.loads(line)["answers"] for line in open(default_questions_path())}
questions = ["Who directed Wings of Desire?"] + [q for q, _ in example_questions()]
gen = Generator("qwen2.5-0.5b")
for retrieval in sys.argv[1:] or ("dense", "hybrid", "dense+links"):
    pipe = Pipeline(build_retriever(default_corpus_path(), retrieval), gen, top_k=5)
    for q in questions:
        a = pipe.ask(q)
        print(
            json.dumps(
                {
                    "retrieval": retrieval,
                    "q": q[:60],
                    "gold": answers.get(q),
                    "answer": a.text,
                    "passages": [p.passage.title for p in a.passages],
                    "named_by": [p.passage.metadata.get("linked_from") for p in a.passages],
                }
            ),
            flush=True,
        )
