"""What `midlens train METHOD` runs for a method that learns: the method's own options with their defaults, the
defaults it wants for the options every training shares, and the function that trains.

A method's registry entry names its recipe's module (`Method.trainer`), so the command line asks the registry
which methods train and never names one; the options are data here, and the command line turns them into flags.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from midlens.core.errors import MidlensError
from midlens.training.data import TRAINING_DATA, data_record, training_examples
from midlens.training.loop import LoopConfig


@dataclass(frozen=True)
class Option:
    """One option of a recipe: `--name-with-dashes` on the command line, `name` in the dict `Recipe.train` gets."""

    name: str
    default: Any
    help: str = ""
    type: Callable[[str], Any] | None = None  # None: the default's type (a bool default is an on/off flag)
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Budget:
    """The options every training shares: data, steps and time (the command line fills it)."""

    examples: int
    batch: int = 8
    lr: float = 2e-4
    warmup: float = 0.05
    max_words: int = 80
    seed: int = 0
    max_minutes: float | None = None
    progress: bool = True
    data: str = "hotpotqa"  # training.data.TRAINING_DATA
    # When the budget's clock started: what a recipe does before its training loop (MuDAF scores retrieval heads
    # first, minutes on a CPU) is spent from the same --max-minutes, so the run's wall time is what was asked.
    started: float = field(default_factory=time.perf_counter, compare=False, repr=False)

    @property
    def max_seconds(self) -> float | None:
        """The seconds left for the training loop (0 when preparation used them all), None without a limit."""
        if self.max_minutes is None:
            return None
        return max(0.0, 60 * self.max_minutes - (time.perf_counter() - self.started))

    def note_spent(self, what: str) -> None:
        """Say on stderr how much of the time budget (`max_minutes`) `what` took, and what is left for training."""
        if self.max_minutes is None:
            return
        spent, left = time.perf_counter() - self.started, self.max_seconds
        tail = "training runs one step and stops" if not left else f"{left / 60:.1f} min left for training"
        print(
            f"note: {what} took {spent / 60:.1f} of the {self.max_minutes:g} min budget; {tail}.",
            file=sys.stderr,
            flush=True,
        )

    def plan(self, tokenizer, style: str = "litm") -> tuple[list, LoopConfig, dict]:
        """The train-split examples this budget buys (prompts with instruction `style`), the loop over them and the
        data record the artefact keeps."""
        examples = training_examples(
            tokenizer, self.examples, seed=self.seed, max_words=self.max_words, style=style, data=self.data
        )
        loop = LoopConfig(len(examples), self.batch, self.lr, self.warmup, seed=self.seed)
        return examples, loop, data_record(examples, self.seed, self.max_words, self.data)

    def check(self) -> None:
        for name in ("examples", "batch", "lr"):
            if getattr(self, name) <= 0:
                raise MidlensError(f"{name} {getattr(self, name)}: must be positive.")
        if self.data not in TRAINING_DATA:
            raise MidlensError(f"data {self.data!r}: expected one of {', '.join(TRAINING_DATA)}.")
        if not 0 <= self.warmup < 1:
            raise MidlensError(f"warmup {self.warmup}: a fraction of the steps, in [0, 1).")


BUDGET_FLAGS = ("examples", "batch", "lr", "warmup", "max_words", "seed", "max_minutes", "data")


@dataclass(frozen=True)
class Recipe:
    summary: str
    options: tuple[Option, ...]
    budget: dict = field(default_factory=dict)  # this method's defaults for Budget's fields
    # (LoadedModel, {option name: value}, Budget, artefact folder) -> {"log": ..., "meta": ...}; the meta's
    # "parameters" counts what was trained. A recipe that learns no parameters (channel-scaling's search) adds
    # "summary", the closing line that says what it chose.
    train: Callable[[Any, dict, Budget, str], dict] | None = None
    check: Callable[[dict], None] | None = None  # refuses bad options before any model loads
    trained: str = "parameters"  # what the trained parameters are, for the closing line ("delta", "router")
    # The Budget fields this recipe reads, offered as flags; a search that sets no learning rate and has no
    # training loop leaves --lr, --warmup and --max-minutes out rather than taking and ignoring them.
    budget_flags: tuple[str, ...] = BUDGET_FLAGS
    budget_help: dict = field(default_factory=dict)  # what a flag means for this recipe, where not a training's


def positive(options: dict, *names: str) -> None:
    for name in names:
        if options[name] <= 0:
            raise MidlensError(f"{name.replace('_', '-')} {options[name]}: must be positive.")
