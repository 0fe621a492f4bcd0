"""How to check an answer written elsewhere, as one frozen value: `CheckOptions`, the check path's `AnswerOptions`.

    options = CheckOptions(verify=False)
    checked = Answering(Generator(CHECK_MODEL)).check([prompt], [text], options)

Every shell of the check path spells these fields from their `OptionInfo` (rag/option_fields.py, given
`CheckOptions`): `midlens check`'s flags, the server's check request, the LlamaIndex evaluator's and checked
engine's keywords, and the demo's check tab. The instruction, truncation and retrieval depth are the answer path's
fields (the prompt an answer is checked over is built as one it would be answered from), so they carry its
OptionInfo; `verify` has one default everywhere: on, since a sentence none of whose passages it needs is only found
by removing them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from midlens.core.defaults import CHECK_MODEL, PromptStyle, Truncate
from midlens.core.errors import InvalidArgumentError, Remedy
from midlens.rag.options import AnswerOptions, OptionInfo


def _answer_field(name: str, **absent: str) -> Any:
    """The answer path's field `name`, its default and OptionInfo, with the check path's shells that leave it out."""
    source = next(f for f in dataclasses.fields(AnswerOptions) if f.name == name)
    info = dataclasses.replace(source.metadata["option"], absent=absent, shared_flag=None)
    return field(default=source.default, metadata={"option": info})


_CALLER_SENDS = "the caller sends the passages the answer was written over"


@dataclass(frozen=True)
class CheckOptions:
    """What a caller may choose about checking one answer written elsewhere (`Answering.check`).

    `model`: the reader, the model that reads the answer teacher-forced (None: core.defaults.CHECK_MODEL); a
    server or a Pipeline checks with the model it holds. `verify`: check each citation by ablation (the answer
    re-scored without each cited passage; a sentence that needs none of its passages is flagged). `top_k`,
    `truncate`, `prompt_style`: as AnswerOptions', for the prompt the answer is read after."""

    # The shells that spell CheckOptions: "cli" `midlens check`'s flags, "request" the server's check request (the
    # remote client sends it), "llamaindex" the keywords of MidlensEvaluator and CheckedQueryEngine, "demo" the
    # demo's check tab.
    SHELLS: ClassVar[tuple[str, ...]] = ("cli", "request", "llamaindex", "demo")

    model: str | None = field(
        default=None,
        metadata={
            "option": OptionInfo(
                f"The model that reads the answer (teacher-forced); None: {CHECK_MODEL}.",
                shared_flag="--model",
                absent={
                    "cli": "spelt with the model flags every command that loads a model shares",
                    "request": "the server checks with the model it serves",
                    "demo": "the tab's menu of the page's models, starting at the page's",
                },
            )
        },
    )
    verify: bool = field(
        default=True,
        metadata={
            "option": OptionInfo(
                "Check each citation by ablation (the answer re-scored without the cited passage): a sentence none "
                "of whose cited passages it needs is flagged as possibly unsupported.",
                flag="--verify",
            )
        },
    )
    top_k: int = _answer_field(
        "top_k",
        request=_CALLER_SENDS,
        llamaindex="the response's source nodes are the passages",
    )
    truncate: Truncate = _answer_field(
        "truncate",
        llamaindex="the response's nodes are checked as they are: too many are refused",
        demo="the page drops no passage: a prompt too long says what to lower instead",
    )
    prompt_style: PromptStyle = _answer_field(
        "prompt_style",
        llamaindex="read after the default instruction, as measured",
        demo="the page asks with the default instruction, as measured",
    )

    def __post_init__(self) -> None:
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()):
            raise InvalidArgumentError(
                "expected a packaged model name or a model folder, or None for the checking default.",
                about=Remedy("model", self.model),
            )
        if not isinstance(self.verify, bool):
            raise InvalidArgumentError("expected True or False.", about=Remedy("verify", self.verify))
        # The shared fields are checked as the answer path checks them (one message per mistake).
        AnswerOptions(top_k=self.top_k, truncate=self.truncate, prompt_style=self.prompt_style)

    @property
    def reader(self) -> str:
        """The model that reads the answer: `model`, or the checking default."""
        return self.model or CHECK_MODEL

    def replace(self, **changes: Any) -> CheckOptions:
        return dataclasses.replace(self, **changes)

    @classmethod
    def like(cls, answer_options: AnswerOptions, **changes: Any) -> CheckOptions:
        """The check options that read an answer over the prompt `answer_options` would stack: the same passages
        (`top_k`), truncation and instruction."""
        shared = {n: getattr(answer_options, n) for n in ("top_k", "truncate", "prompt_style")}
        return cls(**{**shared, **changes})


def check_options_from(
    options: CheckOptions | None, keywords: dict[str, Any], shell: str
) -> tuple[CheckOptions, dict[str, Any]]:
    """A shell's keywords split into its CheckOptions (`options` with the fields `shell` spells among `keywords`
    changed) and the rest (e.g. a Generator's device and dtype), so a shell's keywords are the fields' names."""
    from midlens.rag.option_fields import spelt_by

    if options is not None and not isinstance(options, CheckOptions):
        raise InvalidArgumentError(
            f"options={options!r}: pass a CheckOptions (rag.check_options), or the options by keyword."
        )
    spelt = set(spelt_by(shell, CheckOptions))
    changes = {k: v for k, v in keywords.items() if k in spelt}
    rest = {k: v for k, v in keywords.items() if k not in spelt}
    return (options or CheckOptions()).replace(**changes), rest


def check_options_only(
    options: CheckOptions | None, changes: dict[str, Any], shell: str, reader: str | None = None
) -> CheckOptions:
    """`check_options_from` where every keyword must be a field: a shell built around a reader it was given
    (`reader`, that model's loaded name). A `model` naming another reader is refused: the shell reads with the one
    it holds, and a model it would not use must not look as if it did."""
    checked, unknown = check_options_from(options, changes, shell)
    if unknown:
        raise InvalidArgumentError(f"unknown option(s) {', '.join(sorted(unknown))}: CheckOptions' fields only.")
    if reader is not None and checked.model is not None:
        from pathlib import Path

        from midlens.generators.models.packaged_models import canonical_name

        named, held = Path(checked.model), Path(reader)
        same_folder = named.exists() and held.exists() and named.resolve() == held.resolve()
        if canonical_name(checked.model) != reader and not same_folder:
            raise InvalidArgumentError(
                f"the pipeline given reads with {reader!r}, and the check reads with the pipeline's model: leave "
                "model out, or build the shell with from_model(model=...) to read with another.",
                about=Remedy("model", checked.model),
            )
    return checked
