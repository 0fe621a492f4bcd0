"""LlamaIndex's own question-answering prompts, read back into a question and separate passages.

A stock query engine (`index.as_query_engine(llm=MidlensLLM(...))`) formats its context into one of LlamaIndex's
default templates (text QA, tree summarize, refine; completion or chat variant, the ones the default prompt
selectors pick) and hands the LLM a single string. Answered as it comes, that whole string becomes the question of
an empty midlens prompt: the model reads LlamaIndex's instruction inside midlens' one, gets no passage spans and
hence no evidence. Read back, the context chunks become the documents of midlens' own prompt, exactly as
MidlensQueryEngine stacks them.

The patterns are built from the installed llama-index-core's template strings, so a wording change upstream is
followed, not silently missed. A prompt that matches none of them is left alone.

The stock context chat engines (`index.as_chat_engine(chat_mode="context")` and `"condense_plus_context"`) put the
retrieved context in the system turn and the user's message in the last user turn; a non-chat LLM gets the
conversation as `messages_to_prompt`'s "role: content" transcript. Read back, the context becomes the passages and
the last user turn the question (the earlier turns are not part of the midlens prompt: the engine's retriever, too,
reads the latest message alone, and condense_plus_context rewrites a follow-up into a standalone question first).

That rewrite is a prompt of its own (`read_condense_prompt`: condense_plus_context's and condense_question's
templates): the chat history and the follow-up, to be restated as a question. It holds no context and asks for no
answer, so it is not read into passages: the LLM completes it as it is, and what it writes becomes the engine's
retrieval query.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import PurePath

from llama_index.core.chat_engine.condense_plus_context import (
    DEFAULT_CONDENSE_PROMPT_TEMPLATE,
    DEFAULT_CONTEXT_PROMPT_TEMPLATE,
    DEFAULT_CONTEXT_REFINE_PROMPT_TEMPLATE,
)
from llama_index.core.chat_engine.condense_question import DEFAULT_TEMPLATE as CONDENSE_QUESTION_TEMPLATE
from llama_index.core.chat_engine.context import DEFAULT_CONTEXT_TEMPLATE, DEFAULT_REFINE_TEMPLATE
from llama_index.core.prompts.chat_prompts import (
    CHAT_REFINE_PROMPT_TMPL_MSGS,
    TEXT_QA_PROMPT_TMPL_MSGS,
    TREE_SUMMARIZE_PROMPT_TMPL_MSGS,
)
from llama_index.core.prompts.default_prompts import (
    DEFAULT_REFINE_PROMPT_TMPL,
    DEFAULT_TEXT_QA_PROMPT_TMPL,
    DEFAULT_TREE_SUMMARIZE_TMPL,
)
from llama_index.core.query_engine.citation_query_engine import CITATION_QA_TEMPLATE, CITATION_REFINE_TEMPLATE

from midlens.core.passage import Passage

# Title of the passage that carries a refine step's earlier answer, stacked first so the model can keep it.
EARLIER_ANSWER_TITLE = "Earlier answer"
# Metadata keys, in order of preference, that name a chunk the way `to_passage` names a node.
_TITLE_KEYS = ("title", "file_name", "file_path")
# One line of LlamaIndex's default metadata header ("{key}: {value}", MetadataMode.LLM).
_HEADER_LINE = re.compile(r"([A-Za-z_][\w.-]{0,63}): (.*\S.*)")


@dataclass(frozen=True)
class StockRequest:
    """What a recognised stock prompt asks: the template's name, the query and the context chunks as passages."""

    template: str
    question: str
    passages: list[Passage]

    @property
    def cites_in_text(self) -> bool:
        """The answer's text carries "[N]" citations, N numbering the context's chunks in order: CitationQueryEngine's
        template asks for them; a context chat engine's reply has no other place to show which retrieved node (its
        `source_nodes`, in the same order) a sentence rests on. Midlens' markers number passages the same way."""
        return self.template.startswith(("citation", "context_chat"))


def _pattern(template: str) -> re.Pattern[str]:
    """A template string -> a regex that captures its variables from the formatted text.

    Searched, not matched in full: an LLM's `system_prompt`, `query_wrapper_prompt` or `messages_to_prompt` may
    wrap the template. The last variable is greedy so that it runs to the last occurrence of the closing words
    (the query may itself hold a newline); the trailing space LlamaIndex leaves after "Answer:" is optional because
    chat templates and wrappers strip it.
    """
    parts: list[str] = []
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    for literal, field, _, _ in string.Formatter().parse(template):
        if field is None:
            literal = literal.rstrip()
        parts.append(re.escape(literal))
        if field is not None:
            greedy = field == fields[-1]
            parts.append(f"(?P<{field}>.*)" if greedy else f"(?P<{field}>.*?)")
    return re.compile("".join(parts), re.DOTALL)


def _user_text(messages: list) -> str:
    return next(m.content for m in messages if m.role.value == "user")


# template -> (name, pattern); the completion and chat variants of text QA and tree summarize share their text.
_TEMPLATES: dict[str, tuple[str, re.Pattern[str]]] = {}
for _name, _template in (
    ("text_qa", DEFAULT_TEXT_QA_PROMPT_TMPL),
    ("text_qa", _user_text(TEXT_QA_PROMPT_TMPL_MSGS)),
    ("tree_summarize", DEFAULT_TREE_SUMMARIZE_TMPL),
    ("tree_summarize", _user_text(TREE_SUMMARIZE_PROMPT_TMPL_MSGS)),
    ("refine", DEFAULT_REFINE_PROMPT_TMPL),
    ("refine", _user_text(CHAT_REFINE_PROMPT_TMPL_MSGS)),
    # CitationQueryEngine's: numbered "Source N:" chunks, and an answer expected to cite them as "[N]".
    ("citation_qa", CITATION_QA_TEMPLATE.get_template()),
    ("citation_refine", CITATION_REFINE_TEMPLATE.get_template()),
):
    _TEMPLATES.setdefault(_template, (_name, _pattern(_template)))

# The system turn LlamaIndex's chat QA templates put before the user turn: dropped with the template's own words.
STOCK_SYSTEM_PROMPTS = frozenset(
    m.content for m in (*TEXT_QA_PROMPT_TMPL_MSGS, *TREE_SUMMARIZE_PROMPT_TMPL_MSGS) if m.role.value == "system"
)


def _header(block: str) -> dict[str, str] | None:
    """The key: value pairs of a metadata header block, or None when some line is not one."""
    pairs = [_HEADER_LINE.fullmatch(line.strip()) for line in block.splitlines()]
    if not pairs or not all(pairs):
        return None
    return {m.group(1): m.group(2).strip() for m in pairs if m}


def _title(header: dict[str, str]) -> str:
    for key in _TITLE_KEYS:
        if header.get(key):
            return header[key] if key == "title" else PurePath(header[key]).stem
    return ""


def split_context(context: str) -> list[Passage]:
    """A stock synthesizer's context string -> one Passage per node it holds.

    The synthesizer joins each node's `get_content(MetadataMode.LLM)` with blank lines, and a node's content is
    "{metadata header}\\n\\n{text}" when it has metadata the LLM may see. When the context opens with such a
    header, every later block that shares one of its keys starts the next node and the blocks between belong to
    the node before (its paragraphs); the header names the passage (title, else the file's stem, as `to_passage`
    does) and stays out of its text. Without a header there is no node boundary to find: each block is a passage.
    """
    blocks = [b.strip() for b in re.split(r"\n[ \t]*\n", context) if b.strip()]
    first = _header(blocks[0]) if len(blocks) > 1 else None
    if first is None:
        return [Passage(text=block) for block in blocks]
    groups: list[tuple[dict[str, str], list[str]]] = []
    for block in blocks:
        header = _header(block)
        if header is not None and set(header) & set(first):
            groups.append((header, []))
        else:
            groups[-1][1].append(block)
    return [Passage(text="\n\n".join(texts), title=_title(header)) for header, texts in groups if texts]


# A CitationQueryEngine source: "Source N:" on a line of its own, then the chunk (a node's metadata header, when the
# LLM may see it, comes before that line).
_SOURCE_LINE = re.compile(r"^Source (\d+):[ \t]*$", re.MULTILINE)


def split_sources(context: str) -> list[Passage]:
    """CitationQueryEngine's context -> one Passage per numbered source, in order, titled by the metadata header
    that precedes its "Source N:" line (if any) and named "Source N" otherwise."""
    marks = list(_SOURCE_LINE.finditer(context))
    # The first source's metadata header, when the LLM may see metadata, comes before its "Source 1:" line.
    preamble = [b.strip() for b in re.split(r"\n[ \t]*\n", context[: marks[0].start()] if marks else "") if b.strip()]
    passages, header = [], _header(preamble[-1]) if preamble else None
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(context)
        blocks = [b.strip() for b in re.split(r"\n[ \t]*\n", context[mark.end() : end]) if b.strip()]
        following = _header(blocks[-1]) if len(blocks) > 1 and i + 1 < len(marks) else None
        if following is not None:
            blocks.pop()  # the next source's metadata header
        title = _title(header) if header else ""
        passages.append(Passage(text="\n\n".join(blocks), title=title or f"Source {mark.group(1)}"))
        header = following
    return passages


# The context chat engines' system turns (their QA and refine forms): the engine appends the LLM's system prompt.
_CHAT_TEMPLATES = [
    (name, _pattern(template))
    for name, template in (
        ("context_chat", DEFAULT_CONTEXT_TEMPLATE),
        ("context_chat_refine", DEFAULT_REFINE_TEMPLATE),
        ("context_chat", DEFAULT_CONTEXT_PROMPT_TEMPLATE),
        ("context_chat_refine", DEFAULT_CONTEXT_REFINE_PROMPT_TEMPLATE),
    )
]
# The last turn of a `messages_to_prompt` transcript: the user's message, then the open assistant turn.
_LAST_USER_TURN = "\nuser: "
_OPEN_ASSISTANT_TURN = re.compile(r"\nassistant:\s*\Z")


def read_context_chat(prompt: str) -> StockRequest | None:
    """The question (the last user turn) and passages (the system turn's context) of a stock context chat engine's
    prompt as a non-chat LLM receives it; None for any other prompt."""
    end = _OPEN_ASSISTANT_TURN.search(prompt)
    start = prompt.rfind(_LAST_USER_TURN, 0, end.start()) if end is not None else -1
    if start < 0:
        return None
    question = prompt[start + len(_LAST_USER_TURN) : end.start()].strip()
    system = prompt[:start]  # the context lies before the question's turn; an answer in the history may not shadow it
    for name, pattern in _CHAT_TEMPLATES:
        found = pattern.search(system)
        if found is None:
            continue
        values = found.groupdict()
        passages = split_context(values.get("context_str", values.get("context_msg", "")))
        if not question or not passages:
            return None
        if name == "context_chat_refine" and values["existing_answer"].strip():
            # After the context's chunks, so that chunk N stays passage N and its marker "[N]".
            passages.append(Passage(text=values["existing_answer"].strip(), title=EARLIER_ANSWER_TITLE))
        return StockRequest(name, question, passages)
    return None


# The chat engines' prompts that rewrite a follow-up into a standalone question (condense_plus_context's, and
# condense_question's, which `as_chat_engine(chat_mode="condense_question")` sends).
_CONDENSE_TEMPLATES = [
    (name, _pattern(template))
    for name, template in (
        ("condense_plus_context", DEFAULT_CONDENSE_PROMPT_TEMPLATE),
        ("condense_question", CONDENSE_QUESTION_TEMPLATE),
    )
]


# "[n]" citation markers ("[1][3]", "[2?]") with the space before them.
_MARKERS = re.compile(r" ?(?:\[\d+\??\])+")


@dataclass(frozen=True)
class CondenseRequest:
    """A stock condense prompt: the template's name and the prompt to complete."""

    template: str
    prompt: str


def read_condense_prompt(prompt: str) -> CondenseRequest | None:
    """A prompt formatted from a stock condense template, the citation markers of its chat history left out; None
    for any other prompt.

    Answered over passages, as a question, a condense prompt's reply was an answer ("1931", "2023 [1]"), and that
    answer became the engine's retrieval query; the engine expects the follow-up restated as a question. The
    history's markers number the passages of earlier turns, which the rewrite does not see: a model that copies
    them would put them in the query."""
    for name, pattern in _CONDENSE_TEMPLATES:
        found = pattern.search(prompt)
        if found is None or not found.group("question").strip():
            continue
        start, end = found.span("chat_history")
        history = _MARKERS.sub("", prompt[start:end])
        return CondenseRequest(name, (prompt[:start] + history + prompt[end:]).strip())
    return None


def read_stock_prompt(prompt: str) -> StockRequest | None:
    """The question and passages of a prompt formatted from one of LlamaIndex's default QA / refine templates or
    context chat engines' system turns; None for any other prompt (it is then answered as it is)."""
    chat = read_context_chat(prompt)
    if chat is not None:
        return chat
    for name, pattern in _TEMPLATES.values():
        found = pattern.search(prompt)
        if found is None:
            continue
        values = found.groupdict()
        question = values["query_str"].strip()
        context = values.get("context_str", values.get("context_msg", ""))
        passages = split_sources(context) if name.startswith("citation") else split_context(context)
        if not question or not passages:
            return None
        if name in ("refine", "citation_refine") and values["existing_answer"].strip():
            earlier = Passage(text=values["existing_answer"].strip(), title=EARLIER_ANSWER_TITLE)
            # After the numbered sources, so that passage N is still "Source N" and its marker "[N]".
            passages.insert(len(passages) if name == "citation_refine" else 0, earlier)
        return StockRequest(name, question, passages)
    return None
