"""Errors a user can act on. Each message says what was wrong, where, and what to do."""

from dataclasses import dataclass
from typing import Literal


class MidlensError(Exception):
    """Base class: anything midlens refuses on purpose."""


class ModelError(MidlensError):
    """A model could not be found, verified or loaded."""


class CorpusError(MidlensError):
    """A corpus file or folder cannot be read as documents."""


class RetrievalIndexError(MidlensError):
    """A saved retrieval index is missing, corrupt or built for something else."""


@dataclass(frozen=True)
class Remedies:
    """How one interface spells what its user can change when a prompt does not fit: Python keywords by default;
    the command line, the demo and the LlamaIndex reranker pass their own. Each is a clause that can follow "to fix
    it, ..."; `fewer` takes the passage count as {n}; None: that interface has no such knob."""

    room: str = "the context window minus room for the answer"
    fewer: str | None = "retrieve at most {n} passages (top_k={n})"
    drop: str | None = "pass truncate='drop_last' to keep the passages that fit"
    longer: str = "use a model with a longer context window"
    split: str = "split passages into smaller chunks"


def _either(clauses: list[str]) -> str:
    return clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + ", or " + clauses[-1]


class PromptTooLongError(MidlensError):
    """The stacked prompt does not fit the model's context window.

    `part` says what is too long: "passages" (fewer or shorter passages would fit), "question" (the question does
    not fit even without passages, so retrieving fewer cannot help), "passage" (`subject`, one passage, does not
    fit a prompt even alone) or "conversation" (a chat). `prompt_tokens` is the size of the prompt measured, a
    lower bound when `exact` is False (the stack is far beyond the window). The message is written from these
    fields by `describe`, in one place; an interface that spells its options its own way calls
    `describe(its Remedies)` instead of rewording the error.
    """

    def __init__(
        self,
        prompt_tokens: int,
        window: int,
        passages_that_fit: int = 0,
        passages: int = 0,
        part: Literal["passages", "question", "passage", "conversation"] = "passages",
        exact: bool = True,
        subject: str = "",
        remedies: Remedies | None = None,
    ):
        self.prompt_tokens = prompt_tokens
        self.window = window
        self.passages_that_fit = passages_that_fit
        self.passages = passages
        self.part = part
        self.exact = exact
        self.subject = subject
        super().__init__(self.describe(remedies or Remedies()))

    def describe(self, remedies: Remedies) -> str:
        room = f"the {self.window} tokens available ({remedies.room})"
        if self.part == "question":
            return (
                f"the question is too long: without any passage the prompt takes {self.prompt_tokens} tokens, more "
                f"than {room}. Shorten the question, or {remedies.longer}."
            )
        if self.part == "conversation":
            return (
                f"the conversation is {self.prompt_tokens} tokens, more than {room}; drop or shorten earlier "
                f"messages, or {remedies.longer}."
            )
        if self.part == "passage":
            return (
                f"{self.subject} does not fit one prompt: stacked alone under the question it takes "
                f"{self.prompt_tokens} tokens, more than {room}. To fix it, {remedies.split}."
            )
        size = f"the stacked prompt is {'' if self.exact else 'over '}{self.prompt_tokens} tokens, more than {room}"
        if not self.passages_that_fit:
            return f"{size}; not even the first passage fits. To fix it, {_either([remedies.split, remedies.longer])}."
        n = self.passages_that_fit
        fixes = [remedies.fewer.format(n=n)] if remedies.fewer else []
        fixes += [remedies.drop] if remedies.drop else []
        return f"{size}; {n} of {self.passages} passages would fit. To fix it, {_either([*fixes, remedies.longer])}."


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
