"""Errors a user can act on. Each message says what was wrong, where, and what to do."""

from typing import Literal


class MidlensError(Exception):
    """Base class: anything midlens refuses on purpose."""


class ModelError(MidlensError):
    """A model could not be found, verified or loaded."""


class CorpusError(MidlensError):
    """A corpus file or folder cannot be read as documents."""


class RetrievalIndexError(MidlensError):
    """A saved retrieval index is missing, corrupt or built for something else."""


class PromptTooLongError(MidlensError):
    """The stacked prompt does not fit the model's context window.

    `part` says what is too long: "passages" (fewer or shorter passages would fit) or "question" (the
    question does not fit even without passages, so retrieving fewer cannot help). `prompt_tokens` is the
    size of the whole stacked prompt, or of the longest prefix measured when the stack is far beyond the
    window (then a lower bound; the message says "over"). Shells that spell options their own way (the CLI's
    --top-k) rebuild the advice from these fields.
    """

    def __init__(
        self,
        message: str,
        prompt_tokens: int,
        window: int,
        passages_that_fit: int,
        passages: int,
        part: Literal["passages", "question"] = "passages",
    ):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.window = window
        self.passages_that_fit = passages_that_fit
        self.passages = passages
        self.part = part


class MethodConfigError(MidlensError):
    """A generator method or one of its options is invalid."""


class DeviceError(MidlensError):
    """A device or dtype was asked for that this machine or model cannot give."""


class ArtefactError(MidlensError):
    """A trained artefact (weights + metadata) is missing, damaged or made for another model."""


class InvalidArgumentError(MidlensError, ValueError):
    """An argument has a value midlens cannot use (an empty question, top_k below 1, ...).

    Also a ValueError, so callers that caught the ValueError these checks used to raise keep working.
    """


def invalid_json(where: str, err: ValueError) -> CorpusError:
    """The error for a line that is not JSON, naming file:line and the column. json's messages may end in "starting
    at", so the column is joined to read whole ("Unterminated string starting at column 9")."""
    msg, column = getattr(err, "msg", str(err)), getattr(err, "colno", None)
    if column is None:
        return CorpusError(f"{where}: invalid JSON: {msg}.")
    joined = f"{msg} column {column}" if msg.endswith(" at") else f"{msg} at column {column}"
    return CorpusError(f"{where}: invalid JSON: {joined}.")
