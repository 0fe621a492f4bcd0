"""How answers are compared as text: SQuAD's normalisation (lowercase, punctuation and the articles a/an/the
removed, whitespace collapsed). Evaluation scores with it; the datasets use it to keep answer-bearing sentences and
to refuse distractors that contain an answer, so both read an answer the same way."""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())
