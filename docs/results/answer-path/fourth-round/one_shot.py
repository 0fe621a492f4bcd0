"""Prototype: one worked example (a train-split two-hop question, not in the tuning copy) before the documents.
Resumable.

    python docs/results/answer-path/fourth-round/one_shot.py qwen2.5-0.5b OUT.jsonl I/N \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5

Why: the reader often answers with a sentence or with the wrong entity of two hops; one demonstration of
"follow the bridge entity, answer with the final one" costs ~120 prompt tokens per question.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuning_loop.py, one folder up

from tuning_loop import run  # noqa: E402

import midlens.generators.models.prompt as P  # noqa: E402

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

run(lambda pipe, question: pipe.ask(question, calibrate=False))
