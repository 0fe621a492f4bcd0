"""Passages -> one chat-templated prompt in the lost-in-the-middle format, with exact token spans.

Layout of the user turn (Liu et al. 2023), under one of the instructions of `STYLES`:
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

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from midlens.core.defaults import DEFAULT_PROMPT_STYLE, Truncate
from midlens.core.errors import PromptTooLongError
from midlens.core.passage import Passage
from midlens.core.sentences import sentence_spans
from midlens.core.validation import check_prompt_style, check_question

# The instruction above the documents, by style name.
#   litm   Liu et al.'s, the default: the sweeps compare with the literature, the shipped artefacts were trained
#          on it, and it answers more questions right end to end.
#   short  asks for the bare answer (given "litm", small models restate the question first). Measured
#          (docs/results/answer-path), substring EM / F1, short vs litm:
#            tuning slice, 60 HotpotQA train-split questions, 2 gold + 3 distractors, 24 tokens:
#              Qwen2.5-0.5B 31.7 / 37.6 vs 36.7 / 26.9; SmolLM2-135M 18.3 / 8.0 vs 15.0 / 5.2
#            the 40 end-to-end questions (retrieved top-5, 16 tokens):
#              Qwen2.5-0.5B 12.5 / 16.1 vs 20.0 / 13.8; SmolLM2-135M 17.5 / 9.7 vs 25.0 / 13.1
#          Crisper answers, but fewer right ones: an option, not the default.
STYLES = {
    "litm": (
        "Write a high-quality answer for the given question using only the provided search results "
        "(some of which might be irrelevant)."
    ),
    "short": (
        "Answer the question using only the documents below (some of which might be irrelevant). "
        "Reply with the answer alone: a name, date, number, or yes/no, copied from the documents; no sentence."
    ),
}
DEFAULT_STYLE = DEFAULT_PROMPT_STYLE
CONTENT_FREE_QUESTION = "N/A"


@dataclass(frozen=True)
class PromptSentence:
    """One sentence of a passage: where it is in the passage's own text (characters) and in the prompt (tokens).

    The token ranges of a passage's sentences and of its heading ("Document [i](Title: ...)") tile the
    passage's token span: a token that straddles two sentences belongs to the one it starts."""

    chars: tuple[int, int]  # [start, end) in Passage.text
    tokens: tuple[int, int]  # [start, end) in StackedPrompt.input_ids


@dataclass(frozen=True)
class Segment:
    """A piece of one passage in the prompt: its heading ("Document [i](Title: ...)", `sentence` None) or one of its
    sentences. A passage's segments tile its token span, heading first."""

    tokens: tuple[int, int]  # [start, end) in StackedPrompt.input_ids
    passage: int  # index into StackedPrompt.passages
    sentence: int | None  # index into StackedPrompt.sentences[passage]; None for the heading


@dataclass
class StackedPrompt:
    text: str
    input_ids: list[int]
    passages: list[Passage]
    passage_spans: list[tuple[int, int]]  # token [start, end) of each "Document [i](...) ..." line
    question: str
    question_span: tuple[int, int]
    dropped: list[Passage] = field(default_factory=list)  # passages cut by truncate="drop_last"
    style: str = DEFAULT_STYLE  # the instruction's name in STYLES; re-renders (calibration) keep it
    sentences: list[list[PromptSentence]] = field(default_factory=list)  # per passage, in passage order

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    def segments(self) -> list[Segment]:
        """Every passage's heading then its sentences, passage by passage (the units citations are read over); a
        prompt made by hand without sentences gives one heading segment per whole passage."""
        out = []
        per_passage = self.sentences or [[] for _ in self.passage_spans]
        for p, ((start, end), sentences) in enumerate(zip(self.passage_spans, per_passage, strict=True)):
            out.append(Segment((start, sentences[0].tokens[0] if sentences else end), p, None))
            out += [Segment(sentence.tokens, p, i) for i, sentence in enumerate(sentences)]
        return out


def render_document(index: int, passage: Passage) -> str:
    text = " ".join(passage.text.split())
    return f"Document [{index}](Title: {passage.title}) {text}"


# The one check of a style name, under the name the serving layer imports.
check_style = check_prompt_style


def _user_content(
    passages: list[Passage], question: str, style: str
) -> tuple[str, list[tuple[int, int]], tuple[int, int]]:
    instruction = STYLES[style]  # checked where the prompt is asked for (build_prompt, fit_prompt)
    parts = [instruction, "\n\n"]
    pos = len(instruction) + 2
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


def _chars_to_tokens(offsets: list[tuple[int, int]], char_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token range [first, last) of the tokens overlapping each char range [start, end).

    Binary search over the offsets of the non-empty tokens: a fast tokenizer's offsets never go backwards,
    and a linear scan per span made rendering quadratic in the number of passages.
    """
    kept = [i for i, (s, e) in enumerate(offsets) if e > s]  # special tokens have empty offsets
    starts = [offsets[i][0] for i in kept]
    ends = [offsets[i][1] for i in kept]
    spans = []
    for start, end in char_spans:
        first = bisect.bisect_right(ends, start)  # first token ending after `start`
        last = bisect.bisect_left(starts, end) - 1  # last token starting before `end`
        if first >= len(kept) or last < first:
            raise ValueError(f"characters [{start}, {end}) map to no token of the rendered prompt.")
        spans.append((kept[first], kept[last] + 1))
    return spans


def render(tokenizer, passages: list[Passage], question: str, style: str = DEFAULT_STYLE) -> StackedPrompt:
    """Render without any length check."""
    return render_many(tokenizer, [(passages, question, style)])[0]


def render_many(
    tokenizer, requests: list[tuple[list[Passage], str, str]], sentences: bool = True
) -> list[StackedPrompt]:
    """`render` of several (passages, question, style) at once: one call of the tokenizer, which a fast tokenizer
    spreads over the machine's cores. `sentences=False` leaves the passages' sentences out (a prompt read for its
    passage and question spans only, such as a calibration pass's)."""
    texts, layouts = [], []
    for passages, question, style in requests:
        content, char_spans, question_chars = _user_content(passages, question, style)
        messages = [{"role": "user", "content": content}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:  # a base model: the plain text after the BOS its tokenizer would add (Gemma needs it)
            text = plain_prefix(tokenizer) + content  # ends at "Answer:", where a base model continues
        texts.append(text)
        layouts.append((text.index(content), char_spans, question_chars))
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    prompts = []
    for (passages, question, style), text, (base, char_spans, question_chars), ids, offset_mapping in zip(
        requests, texts, layouts, encoded["input_ids"], encoded["offset_mapping"], strict=True
    ):
        offsets = [tuple(o) for o in offset_mapping]
        starts = [
            _sentence_starts(p, j, base + chars[0]) if sentences else ([], [])
            for j, (p, chars) in enumerate(zip(passages, char_spans, strict=True), start=1)
        ]
        # Every span in one pass over the offsets: a pass per sentence made a render cost sentences x tokens (29
        # ms for ten 100-word passages; 32 of them, a batch's calibration prompts, outlasted its decoding on a GPU).
        firsts = [(c, c + 1) for _, chars in starts for c in chars]
        mapped = _chars_to_tokens(offsets, [(base + s, base + e) for s, e in [*char_spans, question_chars]] + firsts)
        spans, q_span, first_tokens = mapped[: len(char_spans)], mapped[len(char_spans)], mapped[len(char_spans) + 1 :]
        per_passage, at = [], 0
        for (passage_sentences, _), span in zip(starts, spans, strict=True):
            tokens = [first for first, _ in first_tokens[at : at + len(passage_sentences)]]
            per_passage.append(_passage_sentences(passage_sentences, tokens, span))
            at += len(passage_sentences)
        prompts.append(
            StackedPrompt(
                text,
                list(ids),
                list(passages),
                spans,
                question,
                q_span,
                style=style,
                sentences=per_passage if sentences else [],
            )
        )
    return prompts


def _sentence_starts(passage: Passage, index: int, line_start: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The sentences of `passage` (rendered as line `index`, starting at prompt character `line_start`) and the
    prompt character each one starts at."""
    sentences = sentence_spans(passage.text)
    if not sentences:
        return [], []
    # render_document collapses whitespace: each non-space character of the passage moves to a known place.
    word_starts, rendered_starts, rendered = [], [], 0
    for word in re.finditer(r"\S+", passage.text):
        word_starts.append(word.start())
        rendered_starts.append(rendered)
        rendered += word.end() - word.start() + 1
    heading = len(render_document(index, Passage(text="", title=passage.title)))  # "Document [i](Title: t) "
    moved = []
    for start, _ in sentences:  # a sentence starts on a non-space character, inside some word
        w = bisect.bisect_right(word_starts, start) - 1
        moved.append(rendered_starts[w] + start - word_starts[w])
    return sentences, [line_start + heading + m for m in moved]


def _passage_sentences(
    sentences: list[tuple[int, int]], first_tokens: list[int], span: tuple[int, int]
) -> list[PromptSentence]:
    """A passage's sentences from the token each one's first character falls in, kept inside the passage's span."""
    if not sentences:
        return []
    firsts = [min(max(token, span[0]), span[1]) for token in first_tokens]
    ends = [*firsts[1:], span[1]]
    return [
        PromptSentence(chars, (first, max(first, end)))
        for chars, first, end in zip(sentences, firsts, ends, strict=True)
    ]


# Characters one render may cover per token of the budget. English averages about 4 characters a token; 16
# leaves room for long words and numbers, so one render (of a prefix that is bounded, however many passages
# come in) almost always decides how many passages fit.
_CHARS_PER_TOKEN_BOUND = 16


def fit_passages(
    tokenizer, passages: list[Passage], question: str, max_tokens: int, style: str = DEFAULT_STYLE
) -> StackedPrompt:
    """The prompt of the longest prefix of `passages` that fits in `max_tokens`; the rest is in `dropped`."""
    return _fit(tokenizer, passages, check_question(question), max_tokens, check_prompt_style(style))[0]


def _fit(
    tokenizer, passages: list[Passage], question: str, max_tokens: int, style: str = DEFAULT_STYLE
) -> tuple[StackedPrompt, int, bool]:
    """(the prompt of the longest prefix of `passages` that fits in `max_tokens`, with the rest in `dropped`;
    the tokens of the longest prefix rendered; whether that prefix held every passage).

    Renders one prefix (at most `_CHARS_PER_TOKEN_BOUND` characters per token of the budget) and reads the
    cut from its passage spans: the prompt with `f` passages takes about the tokens up to the end of passage
    `f` plus those after the last passage. One or two more renders confirm the cut exactly, so the cost is
    that of a prompt a few times the window, for any number of passages. The kept prompt may hold no passage
    when even the first does not fit; a question that does not fit on its own raises PromptTooLongError.
    """
    if max_tokens < 1:
        raise ValueError(
            f"max_tokens={max_tokens} leaves no room for the prompt: lower max_new_tokens below the context window."
        )
    renders: dict[int, StackedPrompt] = {}

    def prompt_of(count: int) -> StackedPrompt:
        if count not in renders:
            renders[count] = render(tokenizer, passages[:count], question, style)
        return renders[count]

    def fits(count: int) -> bool:
        return prompt_of(count).num_tokens <= max_tokens

    budget, probe = max_tokens * _CHARS_PER_TOKEN_BOUND, 0
    while probe < len(passages) and budget >= 0:
        budget -= len(passages[probe].text) + len(passages[probe].title)
        probe += 1
    # Every count <= lo fits and no count >= hi does (-1 and len + 1 stand for "none" and "all").
    lo, hi = -1, len(passages) + 1
    if fits(probe) or probe == 0:
        guess = probe
    else:
        head = prompt_of(probe)
        after = head.num_tokens - head.passage_spans[-1][1]  # tokens after the last passage
        guess = bisect.bisect_right([end + after for _, end in head.passage_spans], max_tokens)
    # Exponential search from the estimate (each render stays near the window's size), then bisection.
    if fits(guess):
        lo, step = guess, 1
        while lo + step < hi and fits(lo + step):
            lo, step = lo + step, step * 2
        hi = min(hi, lo + step)
    else:
        hi, step = guess, 1
        while hi - step > lo and not fits(hi - step):
            hi, step = hi - step, step * 2
        lo = max(lo, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    if lo < 0:
        alone = prompt_of(0)
        raise PromptTooLongError(alone.num_tokens, max_tokens, 0, len(passages), part="question")
    kept = prompt_of(lo)
    kept.dropped = list(passages[lo:])
    longest = max(renders)
    return kept, renders[longest].num_tokens, longest == len(passages)


def fit_windows(
    tokenizer, passages: list[Passage], question: str, max_tokens: int, style: str = DEFAULT_STYLE
) -> Iterator[StackedPrompt]:
    """Consecutive groups of `passages`, each stacked under `question` into the fullest prompt that fits
    `max_tokens` (fit_passages on what the previous groups left), for scoring more passages than one window holds.

    Lazy, so a caller knows how many passages the groups before a failure held. A passage that does not fit even
    alone raises PromptTooLongError with `passages_that_fit=0` and the tokens it takes alone in `prompt_tokens`.
    """
    check_question(question)
    check_prompt_style(style)
    remaining = passages
    while remaining:
        prompt = _fit(tokenizer, remaining, question, max_tokens, style)[0]
        if not prompt.passages:
            first = remaining[0]
            alone = render(tokenizer, [first], question, style).num_tokens
            name = first.id or first.title or "(no id)"
            raise PromptTooLongError(alone, max_tokens, 0, len(passages), part="passage", subject=f"passage {name}")
        yield prompt
        remaining = prompt.dropped


def build_prompt(
    tokenizer,
    passages: list[Passage],
    question: str,
    max_tokens: int,
    truncate: Truncate = "error",
    style: str = DEFAULT_STYLE,
) -> StackedPrompt:
    """Stack passages into a prompt of at most `max_tokens` tokens; never cut silently.

    With truncate="error" an oversized prompt raises PromptTooLongError saying how many passages fit;
    with "drop_last" passages are removed from the end until it fits and listed in `dropped`. A question
    too long on its own raises PromptTooLongError with `part="question"` either way.
    """
    check_question(question)
    check_prompt_style(style)
    if truncate not in ("error", "drop_last"):
        raise ValueError(f"truncate={truncate!r}: expected 'error' or 'drop_last'.")
    prompt, longest_tokens, exact = _fit(tokenizer, passages, question, max_tokens, style)
    fit = len(prompt.passages)
    if not prompt.dropped or (truncate == "drop_last" and fit > 0):
        return prompt
    raise PromptTooLongError(longest_tokens, max_tokens, fit, len(passages), exact=exact)


def plain_prefix(tokenizer) -> str:
    """What a prompt without a chat template starts with: the BOS token when the tokenizer adds one to plain text
    itself (prompts are tokenised with add_special_tokens=False, so their spans index the text as written)."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or tokenizer.bos_token_id is None:
        return ""
    return bos if tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id] else ""


def text_prompt(tokenizer, text: str, max_tokens: int) -> StackedPrompt:
    """Text fed as it is, no documents and no template (an evaluation harness's context): after the tokenizer's
    plain prefix (its BOS, where it adds one). Longer than `max_tokens`: its last `max_tokens` tokens, as harnesses
    truncate a context from the left."""
    text = plain_prefix(tokenizer) + text
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])[-max_tokens:]
    return ids_prompt(ids, text)


def ids_prompt(ids: list[int], text: str = "") -> StackedPrompt:
    """A prompt of given token ids (no documents): its last token plays the question (where evidence queries read)."""
    if not ids:
        raise ValueError("the prompt is empty: give at least one token.")
    return StackedPrompt(text, list(ids), [], [], text[-40:], (len(ids) - 1, len(ids)))


def user_content(passages: list[Passage], question: str, style: str = DEFAULT_STYLE) -> str:
    """The user turn a prompt stacks (its instruction, documents, question), before any chat template."""
    return _user_content(passages, question, style)[0]


def read_user_content(text: str) -> tuple[str, list[Passage], str] | None:
    """(style, passages, question) of a user turn written as `_user_content` writes it (an instruction of STYLES,
    the "Document [i](Title: t) text" lines, "Question: q", "Answer:"), or None for any other text. A prompt read
    back renders to the same text (passage texts are written whitespace-collapsed)."""
    style = next((name for name, instruction in STYLES.items() if text.startswith(instruction + "\n\n")), None)
    if style is None or not text.endswith("\nAnswer:"):
        return None
    body = text[len(STYLES[style]) + 2 : -len("\nAnswer:")]
    documents, sep, question = body.rpartition("\n\nQuestion: ")
    if not sep and body.startswith("\nQuestion: "):  # no documents at all
        documents, question = "", body[len("\nQuestion: ") :]
    elif not sep:
        return None
    passages = []
    for i, line in enumerate(documents.split("\n") if documents else [], start=1):
        match = _DOCUMENT_LINE.fullmatch(line)
        if match is None or int(match["index"]) != i:
            return None
        passages.append(Passage(match["text"], match["title"], f"document-{i}"))
    return style, passages, question


_DOCUMENT_LINE = re.compile(r"Document \[(?P<index>\d+)\]\(Title: (?P<title>.*?)\) (?P<text>.*)")


def chat_prompt(tokenizer, messages: list[dict[str, str]], max_tokens: int) -> StackedPrompt:
    """A conversation in the model's own chat template (no documents, no RAG instruction): what chat engines
    and agents send. The last message plays the question (its token span is where evidence queries would read)."""
    if not messages or not any((m.get("content") or "").strip() for m in messages):
        raise ValueError("the conversation is empty: pass at least one message with text.")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:  # a model folder without a template: a plain transcript
        text = (
            plain_prefix(tokenizer)
            + "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in messages)
            + "assistant:"
        )
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    if len(ids) > max_tokens:
        raise PromptTooLongError(len(ids), max_tokens, part="conversation")
    last = (messages[-1].get("content") or "").strip()
    start = text.rfind(last) if last else -1
    if start < 0:
        span = (len(ids) - 1, len(ids))
    else:
        (span,) = _chars_to_tokens([tuple(o) for o in enc["offset_mapping"]], [(start, start + len(last))])
    return StackedPrompt(text, ids, [], [], last, span)


def shared_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
