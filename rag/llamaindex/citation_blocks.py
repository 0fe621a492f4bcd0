"""LlamaIndex's own citation types: passages given as `CitableBlock`s in a chat, citations returned as
`CitationBlock`s (llama-index-core 0.14, the types Anthropic-style native citations use).

A chat message may carry `CitableBlock(title, source, content=[TextBlock...])` blocks: each is one passage (its text
the block's text parts joined by blank lines, its id the block's `source`), stacked under the last user message's
text, the question. The answer comes back as a `TextBlock` with the answer's text, then one `CitationBlock` per
(answer sentence, cited passage): `cited_content` the passage sentence cited, `source` and `title` the citable
block's, and `additional_location_info` the character offsets of the answer sentence in the answer text
(`answer_start`, `answer_end`), of the cited sentence in the passage text (`source_start`, `source_end`) and the
passage's 1-based place in the prompt (`position`). Evidence, scores and verification are in the response's
additional_kwargs (citations) as for every MidlensLLM answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from llama_index.core.base.llms.types import ChatMessage, CitableBlock, CitationBlock, MessageRole, TextBlock

from midlens.core.passage import Passage

if TYPE_CHECKING:  # torch loads with these; MidlensLLM's module imports this one and must not load torch
    from midlens.generators.answering.answer import Answer
    from midlens.generators.answering.citations import Citation

SEPARATOR = "\n\n"


def citable_request(messages: Sequence[ChatMessage]) -> tuple[str, list[Passage]] | None:
    """(question, passages) of a chat whose messages carry CitableBlocks; None when none does."""
    blocks = [b for m in messages for b in m.blocks if isinstance(b, CitableBlock)]
    if not blocks:
        return None
    users = [m for m in messages if m.role == MessageRole.USER]
    question = "" if not users else "".join(b.text for b in users[-1].blocks if isinstance(b, TextBlock)).strip()
    passages = [
        Passage(text=SEPARATOR.join(t.text for t in b.content if isinstance(t, TextBlock)), title=b.title, id=b.source)
        for b in blocks
    ]
    return question, passages


def citation_blocks(citation: Citation, answer_passages: list[Passage]) -> list[CitationBlock]:
    """One answer sentence's citations as CitationBlocks; `answer_passages` in prompt order (position - 1)."""
    out = []
    for source in sorted(citation.sources, key=lambda s: s.position):
        passage = answer_passages[source.position - 1]
        start, end = source.sentence if source.sentence is not None else (0, len(passage.text))
        out.append(
            CitationBlock(
                cited_content=TextBlock(text=passage.text[start:end]),
                source=passage.id,
                title=passage.title,
                additional_location_info={
                    "answer_start": citation.span[0],
                    "answer_end": citation.span[1],
                    "source_start": start,
                    "source_end": end,
                    "position": source.position,
                },
            )
        )
    return out


def answer_blocks(answer: Answer) -> list[TextBlock | CitationBlock]:
    """The answer's text, then the CitationBlocks of each of its sentences, in order."""
    passages = [p.passage for p in sorted(answer.passages, key=lambda p: p.position)]
    blocks: list[TextBlock | CitationBlock] = [TextBlock(text=answer.text)]
    for citation in answer.citations:
        blocks.extend(citation_blocks(citation, passages))
    return blocks
