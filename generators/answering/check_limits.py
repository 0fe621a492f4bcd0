"""How long an answer to check may be (`Pipeline.check`, `midlens check`), read with the tokenizer alone.

A checked answer is read in one teacher-forced pass after its passages, so it must fit the model's context window
with the question: the limit is the window, the same in Python and on the command line. The command line applies it
before the model loads (`tokenizer_and_window` reads the folder's tokenizer and config, no weights), so a
20,000-word answer is refused in seconds instead of running for minutes first. The server has its own, lower limit
(`midlens serve --max-answer-tokens`).
"""

from __future__ import annotations

from typing import Any

from midlens.core.errors import InvalidArgumentError, MidlensError

# An answer this long makes a check slow enough on a CPU (one pass over it, one more per cited passage with
# --verify) that the command says what it is doing before it starts.
LONG_CHECK_TOKENS = 1024


def answer_tokens(tokenizer: Any, answer: str, window: int, model: str) -> int:
    """The answer's length in tokens; refused when `model`'s `window`-token context window cannot hold it."""
    tokens = len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    if tokens >= window:
        raise InvalidArgumentError(
            f"the answer ({tokens} tokens) does not fit {model}'s {window}-token context window: check a shorter "
            "answer, a sentence or a paragraph at a time."
        )
    return tokens


def tokenizer_and_window(model: str) -> tuple[Any, int] | None:
    """`model`'s tokenizer and context window, read from its folder without the weights (a packaged model's folder
    is converted first, as its load would); None where transformers cannot read them: the load that follows
    reports such a folder in its own words."""
    from transformers import AutoConfig, AutoTokenizer

    from midlens.generators.models.model_cache import resolve_model_dir

    folder = resolve_model_dir(model)
    try:
        window = int(AutoConfig.from_pretrained(folder).max_position_embeddings)
        return AutoTokenizer.from_pretrained(folder), window
    except MidlensError:
        raise
    except Exception:  # noqa: BLE001 - see the docstring: not this check's to word
        return None
