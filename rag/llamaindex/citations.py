"""An Answer's citations as LlamaIndex responses carry them: one JSON-ready row per (answer sentence, cited node).

Rows point into texts a caller holds: `node_chars` into the cited node's text (`node.get_content(MetadataMode.NONE)`,
the text `to_passage` stacks), `answer_chars` into the answer as generated (`metadata["midlens"]["text"]`), and
`marked_chars` into the answer with its markers (`metadata["midlens"]["marked_text"]`). `marker` is the node's
position in the prompt, the number of its "[n]" marker and of its "Document [n]" line.
"""

from __future__ import annotations

from typing import Any, Literal

from midlens.generators.answering.answer import Answer
from midlens.generators.answering.citations import Citation
from midlens.rag.pipeline import marked_answer


def citation_rows(answer: Answer, unverified: Literal["mark", "drop"] = "mark") -> list[dict[str, Any]]:
    """Each cited source of each answer sentence, in answer order, then prompt order within a sentence.

    `unverified` chooses the marked text the `marked_chars` offsets index (`marked_answer`); every source has a row
    either way, its `verified` saying what verification found (None: not verified)."""
    marked = marked_answer(answer, unverified)
    rows = []
    for index, (citation, marked_span) in enumerate(zip(answer.citations, marked.spans, strict=True)):
        rows.extend(sentence_rows(citation, index, marked_span))
    return rows


def sentence_rows(citation: Citation, index: int, marked_span: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """The rows of one answer sentence (the `index`-th, counting from 0), its sources in prompt order.
    `marked_chars` is None for a sentence cited while the answer streams: the marked text exists once it ends."""
    return [
        {
            "node_id": source.passage_id,
            "marker": source.position,
            "node_chars": None if source.sentence is None else list(source.sentence),
            "answer_chars": list(citation.span),
            "marked_chars": None if marked_span is None else list(marked_span),
            "sentence": index,
            "score": source.score,
            "verified": source.verified,
            "logprob_drop": source.logprob_drop,
        }
        for source in sorted(citation.sources, key=lambda s: s.position)
    ]
