"""Prototype: the question also before the documents (Liu et al.'s query-aware contextualization). Resumable.

    python docs/results/answer-path/third-round/question_first.py qwen2.5-0.5b OUT.jsonl I/2 \\
      runs/tune-e2e/hotpotqa_questions.jsonl runs/tune-e2e/hotpotqa_corpus.jsonl runs/tune-e2e/index-dense5
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tuning_loop.py, one folder up

from tuning_loop import run  # noqa: E402

import midlens.generators.models.prompt as P  # noqa: E402


# An experiment, not a feature: it swaps the private layout function of midlens.generators.models.prompt for one with
# the question written twice, so spans, fitting and evidence stay the library's own.
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

run(lambda pipe, question: pipe.ask(question, calibrate=False))
