"""Stacked prompts: exact spans from tokenizer offsets, window checks, explicit truncation."""

from __future__ import annotations

import pytest

from midlens.core.errors import PromptTooLongError
from midlens.generators.models import prompt as prompt_module
from midlens.generators.models.prompt import Passage, build_prompt, render_document
from tests.conftest import planted_passages


class CountingTokenizer:
    """The real tokenizer, counting the encodes asked of it and the characters of the longest: fitting's work,
    counted instead of timed."""

    def __init__(self, tokenizer):
        self.tokenizer, self.encodes, self.longest = tokenizer, 0, 0

    def __getattr__(self, name):  # chat_template, apply_chat_template: the real tokenizer's
        return getattr(self.tokenizer, name)

    def __call__(self, text, **kwargs):
        texts = text if isinstance(text, list) else [text]  # a batch of texts is one encode per text
        self.encodes += len(texts)
        self.longest = max(self.longest, *map(len, texts))
        return self.tokenizer(text, **kwargs)


@pytest.fixture
def offset_reads(monkeypatch):
    """While passages are mapped to token spans: the token offsets given, and how often they are read. Mapping
    every span in one pass reads each offset a few times; a scan per span reads them once per passage."""
    counts = {"offsets": 0, "reads": 0, "calls": 0}
    real = prompt_module._chars_to_tokens

    class Offsets(list):
        def __getitem__(self, index):
            counts["reads"] += 1
            return super().__getitem__(index)

        def __iter__(self):
            for item in super().__iter__():
                counts["reads"] += 1
                yield item

    def counted(offsets, char_spans):
        counts["calls"] += 1
        counts["offsets"] += len(offsets)
        return real(Offsets(offsets), char_spans)

    monkeypatch.setattr(prompt_module, "_chars_to_tokens", counted)
    return counts


def test_one_render_maps_every_span_in_one_pass_over_the_offsets(loaded, offset_reads):
    # Passages, question and every sentence start are mapped together: a pass over the offsets per sentence made a
    # render cost sentences x tokens (29 ms for ten 100-word passages on this project's machine, 9 ms now).
    passages = planted_passages(6, 2)
    prompt = prompt_module.render(loaded.tokenizer, passages, "Which code word?")
    sentences = sum(len(s) for s in prompt.sentences)
    assert sentences > len(passages), "the planted passages should have several sentences each"
    assert offset_reads["calls"] == 1 and offset_reads["offsets"] == prompt.num_tokens, offset_reads
    # A passage without text has no sentences, and the others keep theirs.
    blank = prompt_module.render(loaded.tokenizer, [Passage(text="", title="Blank"), *passages[:2]], "Which?")
    chars = [[s.chars for s in passage] for passage in prompt.sentences[:2]]
    assert blank.sentences[0] == [] and [[s.chars for s in passage] for passage in blank.sentences[1:]] == chars


def window_chars(max_tokens: int) -> float:
    """The most characters one bounded render covers: the passages' text and titles the budget allows, plus a
    quarter for the document markup, instruction and chat template around them."""
    return 1.25 * max_tokens * prompt_module._CHARS_PER_TOKEN_BOUND


@pytest.mark.parametrize("style", ["short", "litm"])
def test_spans_decode_back_to_each_document(loaded, style):
    passages = planted_passages(6, 4)
    prompt = build_prompt(loaded.tokenizer, passages, "Which code word?", max_tokens=4096, style=style)
    assert prompt.style == style
    assert len(prompt.passage_spans) == len(passages)
    for i, ((s, e), p) in enumerate(zip(prompt.passage_spans, passages, strict=True), start=1):
        decoded = loaded.tokenizer.decode(prompt.input_ids[s:e]).strip()
        assert decoded == render_document(i, p)
    s, e = prompt.question_span
    assert loaded.tokenizer.decode(prompt.input_ids[s:e]).strip() == "Which code word?"
    # Spans are ordered and disjoint, and the question comes after the last passage.
    ends = [e for _, e in prompt.passage_spans]
    starts = [s for s, _ in prompt.passage_spans]
    assert all(a <= b for a, b in zip(ends[:-1], starts[1:], strict=True))
    assert prompt.question_span[0] >= ends[-1]


def test_prompt_uses_chat_template_and_lost_in_the_middle_format(loaded):
    prompt = build_prompt(loaded.tokenizer, [Passage("Paris is in France.", "Paris")], "Where is Paris?", 4096)
    assert prompt.text.startswith("<|im_start|>")
    assert "Document [1](Title: Paris) Paris is in France." in prompt.text
    assert prompt.text.rstrip().endswith("<|im_start|>assistant")


def test_styles_set_the_instruction_and_an_unknown_one_is_refused(loaded):
    from midlens.core.errors import InvalidArgumentError
    from midlens.generators.models.prompt import DEFAULT_STYLE, STYLES

    args = (loaded.tokenizer, [Passage("Paris is in France.", "Paris")], "Where is Paris?", 4096)
    assert DEFAULT_STYLE == "litm" and STYLES["litm"] in build_prompt(*args).text
    short = build_prompt(*args, style="short")
    assert STYLES["short"] in short.text and STYLES["litm"] not in short.text and short.style == "short"
    with pytest.raises(InvalidArgumentError, match="prompt style .terse.: expected one of litm, short"):
        build_prompt(*args, style="terse")


def test_too_long_prompt_is_refused_with_counts(loaded):
    passages = planted_passages(8, 2)
    full = build_prompt(loaded.tokenizer, passages, "q?", max_tokens=100_000)
    limit = full.num_tokens - 50
    with pytest.raises(PromptTooLongError) as err:
        build_prompt(loaded.tokenizer, passages, "q?", max_tokens=limit)
    e = err.value
    assert e.prompt_tokens == full.num_tokens and e.window == limit
    assert 0 < e.passages_that_fit < len(passages)
    assert f"{e.passages_that_fit} of {len(passages)} passages would fit" in str(e)
    assert 'truncate="drop_last"' in str(e) and f"top_k={e.passages_that_fit}" in str(e)
    assert [(r.option, r.value) for r in e.remedies] == [("top_k", e.passages_that_fit), ("truncate", "drop_last")]


def test_drop_last_keeps_the_head_and_reports_what_it_dropped(loaded):
    passages = planted_passages(8, 2)
    full = build_prompt(loaded.tokenizer, passages, "q?", max_tokens=100_000)
    kept = build_prompt(loaded.tokenizer, passages, "q?", max_tokens=full.num_tokens - 50, truncate="drop_last")
    assert kept.num_tokens <= full.num_tokens - 50
    assert kept.passages + kept.dropped == passages
    assert kept.dropped, "something had to be dropped"


def test_empty_question_and_bad_truncate_mode(loaded):
    with pytest.raises(ValueError, match="question is empty"):
        build_prompt(loaded.tokenizer, planted_passages(2, 1), "  ", 4096)
    with pytest.raises(ValueError, match="truncate="):
        build_prompt(loaded.tokenizer, planted_passages(2, 1), "q", 4096, truncate="cut")


def test_fitting_any_number_of_passages_tokenizes_a_few_bounded_prefixes(loaded, offset_reads):
    from midlens.generators.models.prompt import render

    # 100 000 passages, as `--top-k 100000` over a big corpus asks: re-rendering one passage fewer at a time
    # took minutes (517 s measured: an encode per passage dropped); one bounded render plus a check or two is a handful
    # of encodes of a window's worth of text (3 each here), however many passages come in (34 million characters).
    passages = planted_passages(8, 2) * 12_500
    tokenizer = CountingTokenizer(loaded.tokenizer)
    kept = build_prompt(tokenizer, passages, "q?", max_tokens=4000, truncate="drop_last")
    with pytest.raises(PromptTooLongError) as err:
        build_prompt(tokenizer, passages, "q?", max_tokens=4000)
    assert tokenizer.encodes <= 2 * 5, f"{tokenizer.encodes} encodes for two fits"
    assert tokenizer.longest <= window_chars(4000), f"one encode of {tokenizer.longest} characters"
    # Spans from offsets in one pass (3 reads each here); a scan per passage made rendering quadratic.
    assert offset_reads["reads"] <= 4 * offset_reads["offsets"], offset_reads
    fit = len(kept.passages)
    assert kept.passages + kept.dropped == passages
    # Exactly the most that fit: one more passage would not.
    assert kept.num_tokens <= 4000 < render(loaded.tokenizer, passages[: fit + 1], "q?").num_tokens
    assert err.value.part == "passages" and err.value.passages_that_fit == fit
    assert f"{fit} of 100000 passages would fit" in str(err.value) and f"top_k={fit}" in str(err.value)


def test_fit_matches_one_passage_at_a_time_for_every_budget(loaded):
    from midlens.generators.models.prompt import render

    passages = planted_passages(8, 5)
    sizes = [render(loaded.tokenizer, passages[:f], "Which code word?").num_tokens for f in range(9)]
    for limit in range(sizes[1], sizes[-1] + 2, 37):
        kept = build_prompt(loaded.tokenizer, passages, "Which code word?", limit, truncate="drop_last")
        assert len(kept.passages) == max(f for f in range(9) if sizes[f] <= limit)
    with pytest.raises(PromptTooLongError, match="not even the first passage fits"):
        build_prompt(loaded.tokenizer, passages, "Which code word?", sizes[1] - 1, truncate="drop_last")


def test_a_question_too_long_on_its_own_says_so(loaded):
    question = "Which code word did the expedition use? " * 40
    with pytest.raises(PromptTooLongError) as err:
        build_prompt(loaded.tokenizer, planted_passages(4, 2), question, max_tokens=300, truncate="drop_last")
    e = err.value
    assert e.part == "question" and e.passages_that_fit == 0 and e.prompt_tokens > 300
    assert str(e).startswith("the question is too long")
    assert "top_k" not in str(e) and "fewer passages" not in str(e)


def test_fit_windows_splits_hundreds_of_passages_into_full_windows_with_bounded_work_each(loaded, offset_reads):
    from midlens.generators.models.prompt import fit_windows, render

    # Each window is fitted on a bounded prefix of what is left, so splitting is linear in the passages: a few
    # encodes per window (3 here, 8 windows), none longer than a window's worth of text. Rendering everything
    # left for each window would make it quadratic. (128 passages: the bounds are per window, so more passages
    # only add windows; 1,000 took two minutes of the suite for the same assertions, 320 forty seconds.)
    passages = planted_passages(8, 2) * 16
    tokenizer = CountingTokenizer(loaded.tokenizer)
    windows = list(fit_windows(tokenizer, passages, "q?", 1500))
    assert tokenizer.encodes <= 5 * len(windows), f"{tokenizer.encodes} encodes for {len(windows)} windows"
    assert tokenizer.longest <= window_chars(1500), f"one encode of {tokenizer.longest} characters"
    assert offset_reads["reads"] <= 4 * offset_reads["offsets"], offset_reads
    assert [p for w in windows for p in w.passages] == passages
    start = 0
    for w in windows[:-1]:  # every window but the last is full: one more passage would not fit
        start += len(w.passages)
        one_more = render(loaded.tokenizer, w.passages + passages[start : start + 1], "q?")
        assert w.num_tokens <= 1500 < one_more.num_tokens
    long = [Passage("word " * 2000, "Long", id="long")]
    with pytest.raises(PromptTooLongError, match="passage long does not fit one prompt"):
        list(fit_windows(loaded.tokenizer, passages[:3] + long, "q?", 1500))
