"""How to answer, as one frozen value: `AnswerOptions`. Every shell translates its own spelling into it (the command
line's flags, the LlamaIndex classes' fields and call keywords, the server's request fields, the demo's controls) and
`Pipeline` reads it; a new answering option is one field here plus its spelling in each shell.

    options = AnswerOptions(top_k=8, restack="mudaf", verify=True)
    pipe = Pipeline.from_corpus(options=options)
    pipe.ask("Who directed Wings of Desire?", max_new_tokens=16)   # a per-call change: options.replace(...)

The checks here are the cheap ones (types, ranges, spec syntax, method names), run when the value is made, before
torch or a model loads; errors name the field by its Python keyword (`about=Remedy(field, value)`), which each shell
renders in its own spelling. What depends on the model ("measured" restacking, the model's default method, the
citation rule) is turned into concrete settings by `resolve`, once a model is known.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from midlens.core.defaults import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT_STYLE,
    DEFAULT_RESTACK_SCORER,
    DEFAULT_TOP_K,
    PROMPT_STYLES,
    RESTACK_MEASURED,
    TRUNCATE_MODES,
    PromptStyle,
    Truncate,
    answer_method_for,
    is_measured_restack,
    measured_restack_for,
)
from midlens.core.errors import InvalidArgumentError, MethodConfigError, Remedy
from midlens.core.method_spec import check_cite_evidence, parse_known_specs, parse_scorer_spec
from midlens.core.validation import check_max_new_tokens, check_prompt_style, check_restack_rounds, check_top_k

if TYPE_CHECKING:  # torch loads with these, after the cheap checks
    from midlens.generators.answering.citations import MeasuredCitations
    from midlens.generators.answering.restack import Restack
    from midlens.generators.methods.registry import MethodConfig


# The shells that spell AnswerOptions (rag/option_fields.py writes each spelling from the fields' OptionInfo):
# "cli" the `midlens ask` flags, "llm" the LlamaIndex LLM's fields and call keywords, "request" the server's request
# fields (its answer request and the chat request's `midlens` object; the remote client sends those), "demo" the demo
# page's answering controls (demo/controls.py).
SHELLS = ("cli", "llm", "request", "demo")


@dataclass(frozen=True)
class OptionInfo:
    """What a shell needs to spell one AnswerOptions field, kept beside the field (its `metadata["option"]`).

    The bounds (`ge`, `gt`, `le`) and `choices` are the ones `AnswerOptions.__post_init__` enforces, restated for the
    shells' schemas and help (a test checks each against the check). `shell_type`: the type the shells declare where
    the Python field takes more (restack: a Restack object too). `flag`: the command line's flag where it is not
    `--name-with-dashes`; `const`: the value the flag takes given alone; `none_flag`: a second flag that sets None.
    `shared_flag`: the command line's flag where a helper shared by several commands writes it (not generated).
    `implies`: fields a given value switches on (in the shells that offer both). `streamed`: False for what a
    streamed answer cannot do (its text is out before its support). `absent`: shell -> why it does not spell it."""

    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] | None = None
    shell_type: Any = None
    flag: str | None = None
    const: Any = None
    none_flag: str | None = None
    shared_flag: str | None = None
    implies: tuple[str, ...] = ()
    streamed: bool = True
    absent: dict[str, str] = field(default_factory=dict)


def _option(default: Any, help: str, **info: Any) -> Any:
    return field(default=default, metadata={"option": OptionInfo(help, **info)})


# Why the server's requests leave a field out.
_CALLER_RETRIEVES = "the caller sends the passages it retrieved"
# Why the demo page has no control for a field.
_PAGE_GREEDY = "the page answers greedily, as measured"


@dataclass(frozen=True)
class AnswerOptions:
    """What a caller may choose about one answer. Defaults are the measured ones (core.defaults).

    `method`: a method spec (`"ms-poe(ratio_max=1.5)"`); None: the model's measured default (core.defaults.
    ANSWER_METHODS), or, given a Generator, the one it runs. `restack`: the method whose evidence re-stacks the
    passages first (a spec, or a generators.answering.restack.Restack), "measured" (the default: restacked where that
    was measured to help the model and method, core.defaults.MEASURED_RESTACKS) or None (the order given);
    `restack_rounds`: its scoring passes. `cite_evidence`: the method whose evidence the citations blend in (None:
    the answering pass's own). `verify`: check each citation by ablation (`Generator.verify`). `abstain`: withhold
    an answer whose support is below `abstain_below` (None: the support model's own threshold, set at 80 % train
    precision), keeping it in `Answer.withheld`. `stop_at_line_end`: end the answer at the end of its first non-empty
    line; None: the model's default, on for a model without a chat template (a base model, e.g. gemma3-270m, goes on
    past its answer to write the next "Question: ... Answer: ..." of the prompt's pattern), off for a chat model."""

    SHELLS: ClassVar[tuple[str, ...]] = SHELLS

    method: str | None = _option(
        None,
        "Method spec: a registry name or NAME(option=value, ...); None: the model's measured default.",
        shared_flag="--method",
        absent={
            "cli": "spelt with the model flags every command that loads a model shares (cli/options.add_model_args)",
            "llm": "the LLM's generator runs one method: its own `method` field, set when it is built",
            "request": "the request's own field, whose default is the server's method",
            "demo": "the page's method menu: the methods the chosen model offers, starting at its measured default",
        },
    )
    top_k: int = _option(
        DEFAULT_TOP_K,
        "Passages to retrieve and stack.",
        ge=1,
        absent={"llm": "LlamaIndex's retriever decides which nodes come", "request": _CALLER_RETRIEVES},
    )
    max_new_tokens: int = _option(
        DEFAULT_MAX_NEW_TOKENS, "Longest answer, in tokens (0: score the passages only).", ge=0
    )
    truncate: Truncate = _option(
        "error",
        "What happens to passages that overflow the context window: error, or drop_last (keep those that fit).",
        choices=TRUNCATE_MODES,
        absent={"demo": "the page drops no passage: a prompt too long says what to lower instead"},
    )
    prompt_style: PromptStyle = _option(
        DEFAULT_PROMPT_STYLE,
        "Instruction above the passages: litm (Liu et al.'s) or short (asks for the bare answer: crisper, but fewer "
        "right answers in our measurements).",
        choices=PROMPT_STYLES,
        absent={"demo": "the page asks with the default instruction, as measured"},
    )
    calibrate: bool = _option(
        True,
        "Also compute calibrated evidence (less that of a content-free question).",
        flag="--no-calibrate",
        absent={"demo": "always on: the page's Details show both score views"},
    )
    temperature: float = _option(
        0.0,
        "Sampling temperature, from 0 (greedy) to 2.",
        ge=0.0,
        le=2.0,
        absent={"cli": "`ask` answers greedily, as measured", "demo": _PAGE_GREEDY},
    )
    top_p: float = _option(
        1.0,
        "Nucleus sampling: the share of the probability mass kept, in (0, 1].",
        gt=0.0,
        le=1.0,
        absent={"cli": "`ask` answers greedily, as measured", "demo": _PAGE_GREEDY},
    )
    seed: int | None = _option(
        0,
        "Sampling seed (with a temperature above 0); None: unseeded.",
        absent={"cli": "`ask` answers greedily", "demo": _PAGE_GREEDY},
    )
    # str | Restack | MethodConfig | None: a Restack carries its own slots
    restack: Any = _option(
        RESTACK_MEASURED,
        f"A method spec (e.g. {DEFAULT_RESTACK_SCORER}) whose evidence scores the passages first; the strongest are "
        "stacked in the slots the model reads best, then the answering method answers (positions, evidence and "
        f"citations stay in the order given). '{RESTACK_MEASURED}' (the default): restacked where that was measured "
        "to help the model and method; None: answered in the order given.",
        shell_type=str | None,
        const=DEFAULT_RESTACK_SCORER,
        none_flag="--no-restack",
    )
    restack_rounds: int = _option(
        1,
        "Scoring passes before answering, each re-scoring the passages where the last one placed them.",
        ge=1,
        absent={
            "llm": "a call's keyword (with its `restack`), not a field: the LLM's own `restack` scores once",
            "demo": "the page's re-order switch scores once",
        },
    )
    cite_evidence: str | None = _option(
        None,
        "The method whose evidence of the prompt the citations blend in (one more prefill; e.g. mudaf); None: the "
        "answering pass's own.",
        shared_flag="--cite-evidence",
        absent={
            "cli": "spelt with the flag other commands share (cli/options.add_cite_evidence_arg)",
            "llm": "a setting of the LLM's generator (its own `cite_evidence` field), made when it is built",
            "request": "the server's operator chooses how it cites",
            "demo": "chosen when the demo starts (`midlens demo --cite-evidence`), for every method on the page",
        },
    )
    verify: bool = _option(
        False,
        "Check each citation by ablation: the answer re-scored with the cited passage removed.",
        absent={"llm": "MidlensQueryEngine's (`verify=True`): it re-scores with the model in this process"},
        # The server sends a streamed answer's citations as its sentences end, before they could be re-scored.
        streamed=False,
    )
    abstain: bool = _option(
        False,
        "Say the passages do not support an answer instead of giving one whose support is below the threshold (the "
        "withheld answer is kept beside it).",
        streamed=False,
    )
    abstain_below: float | None = _option(
        None,
        "With abstain: withhold answers whose support probability is below this, instead of the model's own "
        "threshold (set at 80% precision on the train split).",
        ge=0.0,
        le=1.0,
        implies=("abstain",),
        streamed=False,
        absent={"demo": "the page's abstain switch withholds below each model's own threshold"},
    )
    stop_at_line_end: bool | None = _option(
        None,
        "End the answer at the end of its first non-empty line; None: the model's default (on for a model without a "
        "chat template, which otherwise goes on to write the next question of the prompt's pattern).",
        absent={"demo": "each model's default"},
    )

    def __post_init__(self) -> None:
        if self.method is not None:
            if not isinstance(self.method, str) or not self.method.strip():
                raise InvalidArgumentError(
                    "expected a method spec such as finetuned or ms-poe(ratio_max=1.5), or None for the model's "
                    "default.",
                    about=Remedy("method", self.method),
                )
            try:
                parse_known_specs([self.method])
            except MethodConfigError as err:
                raise MethodConfigError(err.problem, about=Remedy("method", self.method)) from None
        check_top_k(self.top_k)
        check_max_new_tokens(self.max_new_tokens)
        if self.truncate not in TRUNCATE_MODES:
            raise InvalidArgumentError(
                f"expected one of {', '.join(TRUNCATE_MODES)} (what happens to passages that overflow the window).",
                about=Remedy("truncate", self.truncate),
            )
        check_prompt_style(self.prompt_style)
        for name in ("calibrate", "verify", "abstain"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError("expected True or False.", about=Remedy(name, getattr(self, name)))
        if self.stop_at_line_end is not None and not isinstance(self.stop_at_line_end, bool):
            raise InvalidArgumentError(
                "expected True, False, or None for the model's default (on for a model without a chat template).",
                about=Remedy("stop_at_line_end", self.stop_at_line_end),
            )
        if not _number(self.temperature) or not 0 <= self.temperature <= 2:
            raise InvalidArgumentError(
                "the sampling temperature is a number from 0 (greedy) to 2.",
                about=Remedy("temperature", self.temperature),
            )
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidArgumentError(
                "nucleus sampling keeps a share of the probability mass, in (0, 1].", about=Remedy("top_p", self.top_p)
            )
        if self.seed is not None and (not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool)):
            raise InvalidArgumentError("the sampling seed is an integer, or None.", about=Remedy("seed", self.seed))
        if self.verify and self.max_new_tokens == 0:
            raise InvalidArgumentError(
                "nothing is generated (the passages are only scored), so there are no citations to verify.",
                remedies=[Remedy("max_new_tokens", None, "of 1 or more"), Remedy("verify", False)],
                about=Remedy("max_new_tokens", 0),
            )
        self._check_restack()
        check_cite_evidence(self.cite_evidence)
        self._check_abstain()

    def _check_restack(self) -> None:
        check_restack_rounds(self.restack_rounds)
        if self.restack is None or is_measured_restack(self.restack):
            if self.restack_rounds != 1:
                why = "the measured default restacks once, or not at all" if self.restack else "nothing is restacked"
                raise InvalidArgumentError(
                    f"more than one scoring pass needs a named scorer: {why}.",
                    remedies=[Remedy("restack", DEFAULT_RESTACK_SCORER, "(or another method spec) with it")],
                    about=Remedy("restack_rounds", self.restack_rounds),
                )
            return
        if isinstance(self.restack, str):
            parse_scorer_spec(self.restack)
            return
        # A Restack or a MethodConfig was checked when it was made; its rounds are given once.
        rounds = getattr(self.restack, "rounds", None)
        if rounds is not None and self.restack_rounds not in (1, rounds):
            raise InvalidArgumentError(
                f"restack_rounds={self.restack_rounds!r} and Restack(rounds={rounds}) disagree: give the rounds once."
            )

    def _check_abstain(self) -> None:
        below = self.abstain_below
        if below is None:
            return
        if not _number(below) or not 0 <= below <= 1:
            raise InvalidArgumentError(
                "a support probability, from 0 to 1 (e.g. 0.5).", about=Remedy("abstain_below", below)
            )
        if not self.abstain:
            raise InvalidArgumentError(
                "the support below which an answer is withheld, and abstaining is off.",
                remedies=[Remedy("abstain", True)],
                about=Remedy("abstain_below", below),
            )

    def replace(self, **changes: Any) -> AnswerOptions:
        """A copy with `changes` applied and checked; an unknown name is refused with the names there are."""
        unknown = sorted(set(changes) - FIELDS)
        if unknown:
            raise InvalidArgumentError(
                f"unknown answering option(s) {', '.join(unknown)}: AnswerOptions takes {', '.join(sorted(FIELDS))}."
            )
        return dataclasses.replace(self, **changes) if changes else self

    def decoding(self, tokenizer: Any = None) -> dict[str, Any]:
        """The options `Generator.generate` takes, by its keywords, for a model with `tokenizer` (what decides
        `stop_at_line_end` where it is None; no tokenizer: off)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "calibrate": self.calibrate,
            "stop_at_line_end": self.stops_at_line_end(tokenizer),
        }

    def stops_at_line_end(self, tokenizer: Any) -> bool:
        """`stop_at_line_end`, or where it is None the default of the model whose tokenizer this is: on without a
        chat template (the prompt is then plain text the model continues, line after line)."""
        if self.stop_at_line_end is not None:
            return self.stop_at_line_end
        return tokenizer is not None and not getattr(tokenizer, "chat_template", None)

    def withhold(self, answer: Any) -> bool:
        """With `abstain`, withhold `answer` (generators.answering.answer.Answer) when its support is below
        `abstain_below` (or its model's threshold): generators.answering.support.abstain. Returns whether it did."""
        if not self.abstain:
            return False
        from midlens.generators.answering.support import abstain

        return abstain(answer, self.abstain_below)

    def resolve(self, model: str, running: str | None = None) -> ResolvedOptions:
        """The concrete settings for `model` (a registry name or folder): the method (`running`, the canonical spec
        a Generator already runs, where `method` is None; else the model's measured default), the restack
        "measured" means for that model and method, and the citation setting. Imports the registry (torch)."""
        from midlens.generators.answering.citations import MeasuredCitations
        from midlens.generators.answering.restack import Restack
        from midlens.generators.methods.registry import method_config

        method = method_config(self.method if self.method is not None else running or answer_method_for(model))
        restack = self.restack
        if is_measured_restack(restack):
            scorer = measured_restack_for(model, method.spec())
            restack = None if scorer is None else Restack(scorer)
        elif restack is not None and not isinstance(restack, Restack):
            restack = Restack(restack, self.restack_rounds)
        return ResolvedOptions(method, restack, MeasuredCitations(self.cite_evidence))


@dataclass(frozen=True)
class ResolvedOptions:
    """What of AnswerOptions depends on the model, made concrete (`AnswerOptions.resolve`)."""

    method: MethodConfig
    restack: Restack | None
    citations: MeasuredCitations


FIELDS = frozenset(f.name for f in fields(AnswerOptions))


def option_info(name: str, options: type = AnswerOptions) -> OptionInfo:
    """How the shells spell the field `name` (its OptionInfo) of `options` (AnswerOptions, a subclass stating its
    own, or the check path's CheckOptions)."""
    found = [f.metadata["option"] for f in fields(options) if f.name == name]
    if not found:
        known = ", ".join(f.name for f in fields(options))
        raise ValueError(f"{name!r} is no option of {options.__name__}, which has {known}.")
    return found[0]


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
