"""Stacked prompts: exact spans from tokenizer offsets, window checks, explicit truncation."""

from __future__ import annotations

import pytest

from core.errors import PromptTooLongError
from generators.prompt import Passage, build_prompt, render_document
from tests.conftest import planted_passages


def test_spans_decode_back_to_each_document(loaded):
    passages = planted_passages(6, 4)
    prompt = build_prompt(loaded.tokenizer, passages, "Which code word?", max_tokens=4096)
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
    assert "truncate='drop_last'" in str(e)


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
