"""The checks of values a user passes, each written once with one message, for the library's public boundary.

Pipeline, the build_prompt behind Generator.prompt, the LlamaIndex classes and the command line call these where a
value first enters; the layers below trust the types they receive. Messages name the value by its Python keyword
(`option`, where one value has several names: LlamaIndex's `similarity_top_k`). No torch: the command line uses
them before anything heavy loads.
"""

from __future__ import annotations

import numbers

from midlens.core.defaults import PROMPT_STYLES
from midlens.core.errors import InvalidArgumentError, Remedy


def _whole(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_top_k(top_k: object, option: str = "top_k") -> int:
    """The number of passages to retrieve: a whole number of at least 1."""
    if not _whole(top_k) or top_k < 1:
        raise InvalidArgumentError(
            f"{option}={top_k!r}: the number of passages to retrieve must be an integer of at least 1."
        )
    return int(top_k)


def check_max_new_tokens(max_new_tokens: object) -> int:
    """The longest answer: a string or float from a config file would otherwise fail as a TypeError deep in
    generation, after retrieval and the prompt were built."""
    if not _whole(max_new_tokens) or max_new_tokens < 0:
        raise InvalidArgumentError(
            f"max_new_tokens={max_new_tokens!r}: the longest answer, in tokens, must be an integer of at least 0 "
            "(0 scores the passages without generating), e.g. max_new_tokens=32."
        )
    return int(max_new_tokens)


def check_question(question: object) -> str:
    """A question with some text: an empty one would be answered from the passages alone."""
    if not isinstance(question, str) or not question.strip():
        raise InvalidArgumentError("the question is empty: pass the text to answer.")
    return question


def check_prompt_style(style: object) -> str:
    """The instruction above the passages, by name (generators.models.prompt.STYLES)."""
    if style not in PROMPT_STYLES:
        raise InvalidArgumentError(f"prompt style {style!r}: expected one of {', '.join(PROMPT_STYLES)}.")
    return style


def check_restack_rounds(rounds: object, option: str = "restack_rounds") -> int:
    """Scoring passes before a restacked answer: each re-scores the passages where the previous one placed them."""
    if not _whole(rounds) or rounds < 1:
        raise InvalidArgumentError(
            "restacking scores the passages at least once before answering: give a whole number of scoring passes.",
            remedies=[Remedy(option, 1), Remedy(option, 2, "to score again where the first pass placed them")],
            about=Remedy(option, rounds),
        )
    return int(rounds)
