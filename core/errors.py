"""Errors a user can act on. Each message says what was wrong, where, and what to do.

What to do is data when it is an option to change: a `Remedy` names the option by its Python keyword, the value to
give it and why. The message reads it in Python's words (`device="cpu"`); the command line renders the same error
with its flags (`--device cpu`) through `MidlensError.render`, so no layer below the interfaces spells a flag.
A step to run (clear a cached model, score a model's heads, train an artefact) is data too, a `Step`: a Python
caller reads it in plain words, the command line as its command, so no layer below the interfaces names a command.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class Remedy:
    """One option a user can change to get past an error: its Python keyword (`option`), the value to give it
    (None: one the user chooses) and `why`, a clause that follows it ("to run on the CPU")."""

    option: str
    value: object = None
    why: str = ""


@dataclass(frozen=True)
class Step:
    """A step a user runs to get past an error, as each interface runs it. `name` says which ("cache-clear",
    "heads-score", "train", ...: the command line words each as its command), `args` its options by Python keyword
    (None: a value the user picks), `what` the step in plain words naming no interface's command (how a Python
    caller reads it), `why` a clause that follows either wording."""

    name: str
    what: str
    args: dict[str, object] = field(default_factory=dict)
    why: str = ""


# How an interface writes an option with a value (None: the option alone, for a value the user picks).
Spelling = Callable[[str, object], str]
# How an interface words a step its user runs.
StepSpelling = Callable[[Step], str]


def python_spelling(option: str, value: object) -> str:
    """`device="cpu"`, `top_k=3`: what a Python or LlamaIndex caller passes."""
    if value is None:
        return option
    literal = json.dumps(value) if isinstance(value, str) else repr(value)
    return f"{option}={literal}"


def plain_step(step: Step) -> str:
    """A step in plain words: what a Python or LlamaIndex caller reads."""
    return step.what


def _either(clauses: list[str]) -> str:
    return clauses[0] if len(clauses) == 1 else ", ".join(clauses[:-1]) + ", or " + clauses[-1]


def render_remedies(remedies: Sequence[Remedy | Step], spell: Spelling, steps: StepSpelling = plain_step) -> str:
    """'To fix it, pass A why, or B why.' ('..., or run C.' with a step): the options a user may change and the
    steps they may run, in one interface's spelling."""

    def clause(r: Remedy | Step) -> str:
        said = steps(r) if isinstance(r, Step) else spell(r.option, r.value)
        return said + (f" {r.why}" if r.why else "")

    if all(isinstance(r, Remedy) for r in remedies):
        return f"To fix it, pass {_either([clause(r) for r in remedies])}."
    return f"To fix it, {_either([clause(r) if isinstance(r, Step) else 'pass ' + clause(r) for r in remedies])}."


class MidlensError(Exception):
    """Base class: anything midlens refuses on purpose.

    `problem` says what was wrong; `about`, when set, the option and value it is about (the message opens with
    them); `remedies` the options that fix it and the steps to run. `str(err)` words them for Python callers;
    another interface calls `render(its spelling, its steps)`."""

    def __init__(self, problem: str = "", remedies: Sequence[Remedy | Step] = (), about: Remedy | None = None) -> None:
        self.problem = problem
        self.remedies = tuple(remedies)
        self.about = about
        super().__init__(self.render())

    def render(self, spell: Spelling = python_spelling, steps: StepSpelling = plain_step) -> str:
        text = self.problem if self.about is None else f"{spell(self.about.option, self.about.value)}: {self.problem}"
        if not self.remedies:
            return text
        return f"{text} {render_remedies(self.remedies, spell, steps)}"

    def __reduce__(self):
        # Default exception pickling calls cls(*args) with the rendered message: the remedies and a subclass's
        # own fields would be lost on the way from a Ray worker.
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type, args: tuple, state: dict) -> "MidlensError":
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


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
    drop: str | None = 'pass truncate="drop_last" to keep the passages that fit'
    longer: str = "use a model with a longer context window"
    split: str = "split passages into smaller chunks"

    @classmethod
    def spelt(cls, spell: Spelling, n: int) -> "Remedies":
        """The clauses with the options (top_k, truncate, model) in one interface's spelling; `n` passages fit."""
        return cls(
            fewer=f"retrieve at most {n} passages ({spell('top_k', n)})",
            drop=f"pass {spell('truncate', 'drop_last')} to keep the passages that fit",
            longer=f"use a {spell('model', None)} with a longer context window",
        )


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
        self.wording = remedies  # a caller's own clauses (the LlamaIndex reranker's), else spelt per interface
        fixes = []
        if part == "passages" and passages_that_fit:
            fixes = [
                Remedy("top_k", passages_that_fit, f"to retrieve the {passages_that_fit} passages that fit"),
                Remedy("truncate", "drop_last", "to keep the passages that fit"),
            ]
        super().__init__("", fixes)

    def render(self, spell: Spelling = python_spelling, steps: StepSpelling = plain_step) -> str:
        return self.describe(self.wording or Remedies.spelt(spell, self.passages_that_fit))

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
