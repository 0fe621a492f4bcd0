"""How answers are compared as text: SQuAD's normalisation (lowercase, punctuation and the articles a/an/the
removed, whitespace collapsed). Evaluation scores with it; the datasets use it to keep answer-bearing sentences and
to refuse distractors that contain an answer, so both read an answer the same way. `restates_question` says when an
answer is no answer at all: the question again, or a prompt's cue line."""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


# Words that carry no answer: an answer made only of these (or of the question's own words) backs nothing.
STOPWORDS = frozenset(
    "a an and are as at be been but by did do does for from had has have he her his in is it its of on or she "
    "that the their them they this to was were which who whom with".split()
)
# The cue words a prompt puts before a question and its answer ("Question: ...", "Answer:"): a base model continuing
# the prompt writes them as if they were its answer.
CUES = frozenset({"question", "answer"})
_ANSWER_CUE = re.compile(r"\s*answer\s*:", re.IGNORECASE)
_QUESTION_CUE = re.compile(r"\s*question\s*:", re.IGNORECASE)


def restates_question(answer: str, question: str) -> bool:
    """Whether `answer` is no answer to `question`: a bare cue line ("Answer:", "Question:"), a line opening with
    "Question:" (a base model writing the prompt's next question, Gemma 3 270M's "Question: Which canal was built
    ...?"), or the question's normalised text with no word of its own beyond STOPWORDS and the cues. Narrow on
    purpose: an answer drawn from the question's words ("Paris" to "Paris or Lyon?") keeps them in another order or
    leaves some out, and is an answer. An empty answer is not this: it says nothing rather than the question."""
    text = answer.strip()
    while cue := _ANSWER_CUE.match(text):
        text = text[cue.end() :].strip()
    if not text:
        return bool(answer.strip())
    if _QUESTION_CUE.match(text):
        return True
    said, asked = f" {normalize_answer(text)} ", f" {normalize_answer(question)} "
    if not asked.strip() or asked not in said:
        return False
    rest = said.replace(asked, " ", 1).split()
    return all(word in STOPWORDS or word in CUES for word in rest)
