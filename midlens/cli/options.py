"""Options the commands share (model, method spec, device, dtype, evidence), the parser class, and the
command line's spelling of errors raised below (`cli_spelling`: a remedy's `device="cpu"` reads `--device cpu`;
`cli_step`: a step to run reads as its command, `midlens cache clear --model NAME`).

Argparse only at import time (so `--help` stays fast); the parsed strings are validated by the layers below
(`generators.methods.registry.method_config`, `core.device`) before any model loads.
"""

from __future__ import annotations

import argparse

from midlens.core.defaults import ANSWER_METHODS, DEFAULT_MODEL, FALLBACK_ANSWER_METHOD
from midlens.core.errors import InvalidArgumentError, MidlensError, Step

RETRIEVAL_HELP = (
    "dense (faiss) or hybrid (dense + BM25, RRF); with +links, passages whose titles the top 2 name come next"
)
HEADS_HELP = "heads evidence averages: all, or the model's top retrieval heads (shipped score file; overrides layers)"
METHOD_HELP = (
    "method spec: NAME or NAME(option=value, ...), e.g. 'ms-poe(ratio_min=1.0, ratio_max=1.3)'; "
    "`midlens methods` lists the methods and their options"
)


# Switches whose False is a flag of its own.
NEGATED = {"calibrate": "--no-calibrate"}


def cli_spelling(option: str, value: object) -> str:
    """An option as this command line takes it: `--top-k 3`, `--orderings lcr,attn-sort`, `--model` alone when the
    user picks the value."""
    import shlex

    flag = "--" + option.replace("_", "-")
    if value is True:  # a switch: given alone
        return flag
    if value is False:
        return NEGATED.get(option, f"leave out {flag}")
    if value is None:
        return flag
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return f"{flag} {shlex.quote(text)}"


# The library's steps (core.errors.Step names) as this command line runs them: the command, its positional
# arguments taken from the step's args by name, and what follows it. The rest of the args read as flags.
STEP_COMMANDS: dict[str, tuple[str, str]] = {
    "cache-clear": ("cache clear", ", then run the command again"),
    "index-clear": ("index clear", ", then run the command again"),
    "index-build": ("index build", ""),
    "heads-score": ("heads score", ""),
    "train": ("train {method}", ", then ask with --method '{method}(artefact={out})'"),
    "eval-sweep": ("eval sweep", ""),
    "support-runs": ("eval support", ""),
    "support-fit": ("eval support-fit {runs}", ""),
}


def cli_step(step: Step) -> str:
    """`run `midlens heads score --model smollm2-135m --out FOLDER``: a step as this command line runs it; a value
    the user picks reads as the option's name in capitals. A step it does not know reads in plain words."""
    if step.name not in STEP_COMMANDS:
        return step.what
    command, then = STEP_COMMANDS[step.name]
    given = {k: k.upper() if v is None else v for k, v in step.args.items()}
    words = [command.format(**given)]
    words += [cli_spelling(k, v) for k, v in given.items() if "{" + k + "}" not in command]
    return f"run `midlens {' '.join(words)}`{then.format(**given)}"


def cli_message(err: BaseException) -> str:
    """A library error as this command line words it: its options as flags, its steps as commands."""
    return err.render(cli_spelling, cli_step) if isinstance(err, MidlensError) else str(err)


def add_model_args(parser: argparse.ArgumentParser, method: bool = True, default_model: str = DEFAULT_MODEL) -> None:
    parser.add_argument(
        "--model",
        help=f"registry name or local Hugging Face folder (default: {default_model}; for a trained method, the model "
        "its shipped artefact was trained for)",
    )
    if method:
        parser.add_argument(
            "--method",
            help=f"{METHOD_HELP} (default: the model's measured default, core.defaults.ANSWER_METHODS: "
            + ", ".join(f"{method} for {model}" for model, method in ANSWER_METHODS.items())
            + f"; {FALLBACK_ANSWER_METHOD} for a model folder)",
        )
    add_device_args(parser)
    add_evidence_args(parser)


def add_evidence_args(parser: argparse.ArgumentParser) -> None:
    """How evidence is read: which layers, which query rows, which heads (every command that reads it)."""
    parser.add_argument(
        "--evidence-layers", default="upper", help="layers evidence averages: all | upper | lower | e.g. 20,21,22"
    )
    parser.add_argument(
        "--evidence-query",
        default="question",
        choices=["last", "question"],
        help="whose attention scores the passages: the question's tokens (mean) or the last prompt token",
    )
    parser.add_argument("--evidence-heads", default="all", choices=["all", "retrieval"], help=HEADS_HELP)


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when present)")
    parser.add_argument(
        "--dtype",
        default="auto",
        help="auto | float32 | bfloat16 | float16 (auto: bfloat16 on CUDA and on CPUs that run it natively, else "
        "float32; `midlens bench cpu` shows the comparison)",
    )


def check_device(args: argparse.Namespace) -> None:
    """Resolve --device/--dtype now, so a missing GPU is reported before anything loads."""
    from midlens.core.device import resolve_device, resolve_dtype

    resolve_dtype(args.dtype, resolve_device(args.device))


def method_spec(args: argparse.Namespace):
    """--method as a validated MethodConfig (unknown names and options fail here, before any model loads).

    A misspelt name fails before torch is imported, the registry's option check takes the seconds torch needs; the
    spec is parsed once."""
    from midlens.core.defaults import answer_method_for
    from midlens.core.method_spec import parse_known_specs

    if args.method is None:  # named now, so what runs is what the command reports
        args.method = answer_method_for(args.model or DEFAULT_MODEL)
    ((name, options),) = parse_known_specs([args.method]).values()
    from midlens.generators.methods.registry import method_config

    return method_config(name, options)


def chosen_model(args: argparse.Namespace, method, default_model: str = DEFAULT_MODEL) -> str:
    """--model, or the default for `method` (a MethodConfig): a trained method (mudaf, moice) left without --model
    runs on the model its shipped artefact was trained for, with a note. Refuses, before any load, a model the
    method has nothing for. `default_model`: the command's own default (`midlens check`: the checking reader)."""
    import sys

    from midlens.generators.methods.registry import model_for

    model = model_for(method, args.model, default_model)
    if args.model is None and model != default_model:
        print(
            f"note: {method.name} runs on {model}, the model its shipped artefact was trained for "
            f"(the default model {default_model} has none); pass --model to choose.",
            file=sys.stderr,
        )
    return model


def evidence_config(args: argparse.Namespace):
    """--evidence-layers/-query/-heads as an EvidenceConfig (checked by EvidenceConfig.from_text)."""
    from midlens.generators.attention.evidence import EvidenceConfig

    try:
        return EvidenceConfig.from_text(args.evidence_layers, args.evidence_query, args.evidence_heads)
    except InvalidArgumentError as err:  # the same check; on the command line, name the option
        raise InvalidArgumentError("--evidence-" + str(err).removeprefix("evidence ")) from None


def add_cite_evidence_arg(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--cite-evidence", metavar="METHOD", help=help)


def check_cite_evidence(args: argparse.Namespace) -> None:
    """A misspelt --cite-evidence fails before torch and the model load (seconds, or a process per worker), naming
    the option."""
    from midlens.core.method_spec import check_cite_evidence as check_spec

    check_spec(args.cite_evidence)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults after every option's help; descriptions and example epilogs keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # "(default: None)" on an optional path and "(default: False)" on a flag say nothing.
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """The parser of `midlens` and of every subcommand under it (argparse builds subparsers of the parent's class).

    Options declared without a help text still show their default: argparse prints nothing for them otherwise.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.help is None and action.option_strings and action.default not in (None, argparse.SUPPRESS):
            action.help = "(default: %(default)s)"
        return action


def positive_int(text: str) -> int:
    """argparse type for counts that must be at least 1 (argparse names the option in its message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not allowed: use 1 or more")
    return value


def prompt_error_for_cli(err, args: argparse.Namespace) -> str:
    """A PromptTooLongError in the command line's words: its options, not the Python API's keywords."""
    from midlens.core.errors import Remedies

    return err.describe(
        Remedies(
            room=f"the context window of {args.model} minus --max-new-tokens {args.max_new_tokens}",
            fewer="use --top-k {n}",
            drop="use --truncate drop_last to keep the passages that fit",
            longer="use a --model with a longer context window",
            split="use a --corpus with shorter passages or a lower --max-new-tokens",
        )
    )
