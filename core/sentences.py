"""Sentences of a text as character spans: what a citation points at, in an answer and in a passage.

sentencex (Wikimedia's rule-based segmenter, ~300 languages, offline, compiled) splits; its pieces concatenate
back to the text exactly, so spans are cumulative lengths, with the whitespace around each sentence trimmed.
It is chosen over a hand-written regex (abbreviations such as "Dr." and "3 p.m." do not end a sentence), over
NLTK's punkt (its model is a separate download) and over spaCy (a large install for one component). The
English rules also end sentences at the CJK, Arabic and Devanagari terminators (。？！؟।), so mixed-script
passages split without a language switch.
"""

from __future__ import annotations

from sentencex import segment

LANGUAGE = "en"


def sentence_spans(text: str, language: str = LANGUAGE) -> list[tuple[int, int]]:
    """[start, end) of each sentence of `text` (whitespace-only pieces dropped); a text without a boundary is one
    sentence, an empty or blank text has none."""
    spans = []
    pos = 0
    for piece in segment(language, text):
        start, end = pos, pos + len(piece)
        pos = end
        stripped = piece.strip()
        if not stripped:
            continue
        lead = len(piece) - len(piece.lstrip())
        spans.append((start + lead, start + lead + len(stripped)))
    if pos != len(text):  # the segmenter's pieces must tile the text; fall back to one sentence if they do not
        stripped = text.strip()
        return [(text.index(stripped), text.index(stripped) + len(stripped))] if stripped else []
    return spans
