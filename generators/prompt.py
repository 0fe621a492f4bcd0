"""Passages -> one chat-templated prompt in the lost-in-the-middle format, with exact token spans.

Layout of the user turn (Liu et al. 2023):
    Write a high-quality answer ... (some of which might be irrelevant).

    Document [1](Title: t) text
    ...
    Document [k](Title: t) text

    Question: q
    Answer:
Spans come from the tokenizer's offset mapping over the fully rendered chat text, so they are exact for
whatever the template adds around the user turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from core.errors import PromptTooLongError
from core.passage import Passage

INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)
CONTENT_FREE_QUESTION = "N/A"


@dataclass
class StackedPrompt:
    text: str
    input_ids: list[int]
    passages: list[Passage]
    passage_spans: list[tuple[int, int]]  # token [start, end) of each "Document [i](...) ..." line
    question: str
    question_span: tuple[int, int]
    dropped: list[Passage] = field(default_factory=list)  # passages cut by truncate="drop_last"

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)


def render_document(index: int, passage: Passage) -> str:
    text = " ".join(passage.text.split())
    return f"Document [{index}](Title: {passage.title}) {text}"


def _user_content(passages: list[Passage], question: str) -> tuple[str, list[tuple[int, int]], tuple[int, int]]:
    parts = [INSTRUCTION, "\n\n"]
    pos = len(INSTRUCTION) + 2
    char_spans = []
    for i, passage in enumerate(passages, start=1):
        line = render_document(i, passage)
        char_spans.append((pos, pos + len(line)))
        parts += [line, "\n"]
        pos += len(line) + 1
    parts.append("\nQuestion: ")
    pos += len("\nQuestion: ")
    question_chars = (pos, pos + len(question))
    parts += [question, "\nAnswer:"]
    return "".join(parts), char_spans, question_chars


def _chars_to_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """Token range [first, last) of tokens overlapping chars [start, end)."""
    first = next(i for i, (s, e) in enumerate(offsets) if e > start and e > s)
    last = max(i for i, (s, e) in enumerate(offsets) if s < end and e > s) + 1
    return first, last


def render(tokenizer, passages: list[Passage], question: str) -> StackedPrompt:
    """Render without any length check."""
    content, char_spans, question_chars = _user_content(passages, question)
    messages = [{"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = content + "\n"
    base = text.index(content)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    spans = [_chars_to_tokens(offsets, base + s, base + e) for s, e in char_spans]
    q_span = _chars_to_tokens(offsets, base + question_chars[0], base + question_chars[1])
    return StackedPrompt(text, list(enc["input_ids"]), list(passages), spans, question, q_span)


def build_prompt(
    tokenizer,
    passages: list[Passage],
    question: str,
    max_tokens: int,
    truncate: Literal["error", "drop_last"] = "error",
) -> StackedPrompt:
    """Stack passages into a prompt of at most `max_tokens` tokens; never cut silently.

    With truncate="error" an oversized prompt raises PromptTooLongError saying how many passages fit;
    with "drop_last" passages are removed from the end until it fits and listed in `dropped`.
    """
    if not question or not question.strip():
        raise ValueError("question is empty: pass the text to answer.")
    if truncate not in ("error", "drop_last"):
        raise ValueError(f"truncate={truncate!r}: expected 'error' or 'drop_last'.")
    prompt = render(tokenizer, passages, question)
    if prompt.num_tokens <= max_tokens:
        return prompt
    fit = len(passages) - 1
    while fit > 0 and render(tokenizer, passages[:fit], question).num_tokens > max_tokens:
        fit -= 1
    if truncate == "drop_last" and fit > 0:
        kept = render(tokenizer, passages[:fit], question)
        kept.dropped = list(passages[fit:])
        return kept
    raise PromptTooLongError(
        f"the stacked prompt is {prompt.num_tokens} tokens but only {max_tokens} fit "
        f"(context window minus room for the answer); {fit} of {len(passages)} passages would fit. "
        "Retrieve fewer passages (--top-k), use a longer-context model, or pass truncate='drop_last'.",
        prompt_tokens=prompt.num_tokens,
        window=max_tokens,
        passages_that_fit=fit,
        passages=len(passages),
    )


def shared_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
