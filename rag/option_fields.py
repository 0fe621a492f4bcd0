"""Each shell's spelling of AnswerOptions (and of the check path's CheckOptions, rag/check_options.py, given as
`options=`), written from its fields and their OptionInfo (rag/options.py): the command
line's flags (`add_arguments`, `from_arguments`), the pydantic fields of the LlamaIndex LLM and of the server's
requests (`option_model`), and which fields a streamed answer cannot honour (`unstreamed`); the demo page builds its
controls from `spelt_by("demo")` and each field's OptionInfo (demo/controls.py). A new answering option is
its field in AnswerOptions, with its OptionInfo, plus the code that uses it: no shell spells it again.

Defaults come from the fields; bounds and choices from the OptionInfo, which states what `AnswerOptions` enforces
(tests/test_answer_options.py checks the two agree). Torch-free, below the shells.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import MISSING, Field, fields
from typing import TYPE_CHECKING, Any, get_type_hints

from midlens.rag.options import AnswerOptions, OptionInfo

if TYPE_CHECKING:  # pydantic loads where a model is made: the command line's flags (and its --help) do without it
    from pydantic import BaseModel, ConfigDict


# AnswerOptions or CheckOptions: a frozen dataclass whose fields carry an OptionInfo and whose SHELLS name its shells.
Options = type


def _class(options: Options | None) -> Options:
    """`options`, or AnswerOptions (read when called: a test may stand a subclass in for it)."""
    return AnswerOptions if options is None else options


def _fields(options: Options | None = None) -> list[Field]:
    return list(fields(_class(options)))


def _info(field: Field) -> OptionInfo:
    return field.metadata["option"]


def spelt_by(shell: str, options: Options | None = None) -> tuple[str, ...]:
    """The fields `shell` (one of `options.SHELLS`: AnswerOptions' "cli", "llm", "request", "demo") spells, in the
    fields' order; the others say why not (`OptionInfo.absent`)."""
    options = _class(options)
    if shell not in options.SHELLS:
        raise ValueError(f"unknown shell {shell!r}: {options.__name__} is spelt by {', '.join(options.SHELLS)}.")
    return tuple(f.name for f in _fields(options) if shell not in _info(f).absent)


def unstreamed() -> tuple[str, ...]:
    """The fields a streamed answer cannot honour (its text is out before its support is known)."""
    return tuple(f.name for f in _fields() if not _info(f).streamed)


def _annotation(field: Field, options: Options) -> Any:
    info = _info(field)
    if info.shell_type is not None:
        return info.shell_type
    return get_type_hints(_class(options))[field.name]


def _pydantic_field(field: Field, deferred: bool, strict_ints: bool, note: str, options: Options) -> tuple[Any, Any]:
    from pydantic import Field as PydanticField

    info = _info(field)
    annotation = _annotation(field, options)
    default = field.default if field.default is not MISSING else None
    help = info.help
    if deferred:
        # None: the one who answers fills it in (the server: its own default), and its library checks the value
        # then, in the words it uses for every other error; a word from a list travels as a string.
        annotation = (str if info.choices else annotation) | None
        default, help = None, f"{help} Default: the server's."
    strict = strict_ints and annotation in (int, int | None)
    bounds = {k: v for k, v in (("ge", info.ge), ("gt", info.gt), ("le", info.le)) if v is not None}
    if not info.streamed and note:
        help = f"{help} {note}"
    return annotation, PydanticField(default=default, description=help, strict=strict or None, **bounds)


def option_model(
    name: str,
    shell: str,
    exclude: Iterable[str] = (),
    deferred: Iterable[str] = (),
    strict_ints: bool = False,
    unstreamed_note: str = "",
    base: type[BaseModel] | None = None,
    config: ConfigDict | None = None,
    options: Options | None = None,
) -> type[BaseModel]:
    """A pydantic model (a base for a shell's class) with one field per option `shell` spells, less `exclude`: the
    field's default, its help as the description, its bounds. `deferred`: fields whose None means the answerer's
    default. `strict_ints`: an integer sent as a string ("5") is refused, as the Python API refuses it.
    `unstreamed_note`: said after the help of what a stream cannot do."""
    from pydantic import create_model

    skip, later = set(exclude), set(deferred)
    spec = {
        f.name: _pydantic_field(f, f.name in later, strict_ints, unstreamed_note, options)
        for f in _fields(options)
        if f.name in spelt_by(shell, options) and f.name not in skip
    }
    if config is not None:
        return create_model(name, __config__=config, **spec)
    return create_model(name, __base__=base, **spec) if base is not None else create_model(name, **spec)


def flag_of(name: str, options: Options | None = None) -> str:
    """The command line's flag for the field `name` (`--top-k`; `--no-calibrate` for a switch on by default)."""
    flag = next(_info(f).flag for f in _fields(options) if f.name == name)
    return flag or "--" + name.replace("_", "-")


def add_arguments(
    parser: argparse.ArgumentParser,
    exclude: Iterable[str] = (),
    options: Options | None = None,
    only: Iterable[str] | None = None,
) -> None:
    """The command line's flags for the options it spells (less `exclude`), each with `dest` the field's name and
    default the field's: a switch off by default is `--name`, on by default `--no-name`, None-able `--name/--no-name`;
    a `const` flag takes its value alone or one given, with its `none_flag` beside it; a switch on by default whose
    flag is its own name takes `--name/--no-name`. Values are checked by the options (`from_arguments`), whose errors
    the command line words with these flags."""
    skip = set(exclude)
    if only is not None:  # a command that spells a few of the fields (`midlens demo`, `midlens serve`)
        skip |= {f.name for f in _fields(options)} - set(only)
    for field in _fields(options):
        if field.name not in spelt_by("cli", options) or field.name in skip:
            continue
        info, flag, kind = _info(field), flag_of(field.name, options), get_type_hints(_class(options))[field.name]
        common = {"dest": field.name, "default": field.default, "help": info.help.replace("%", "%%")}
        if kind is bool and field.default and flag == "--" + field.name.replace("_", "-"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **common)
        elif kind is bool:
            if field.default:
                common["help"] = f"Turn this off (it is on by default): {common['help']}"
            parser.add_argument(flag, action="store_false" if field.default else "store_true", **common)
        elif kind == bool | None:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **common)
        elif info.const is not None:
            group = parser.add_mutually_exclusive_group()
            common["help"] += f" Given alone: {info.const}."
            group.add_argument(flag, nargs="?", const=info.const, metavar=field.name.upper(), **common)
            if info.none_flag:
                none_help = f"{flag}'s None: see there"
                group.add_argument(
                    info.none_flag,
                    dest=field.name,
                    action="store_const",
                    const=None,
                    default=field.default,
                    help=none_help,
                )
        else:
            number = int if kind in (int, int | None) else float if kind in (float, float | None) else None
            parser.add_argument(flag, type=number, choices=info.choices, **common)


def from_arguments(args: argparse.Namespace, options: Options | None = None, **given: Any) -> Any:
    """The options (AnswerOptions, or `options`) the parsed flags spell (with `given`: what other flags of the
    command spell), a value given switching on what its field implies (`--abstain-below P` is `--abstain
    --abstain-below P`)."""
    values = {name: getattr(args, name) for name in spelt_by("cli", options)}
    for field in _fields(options):
        if field.name in values and values[field.name] not in (None, False):
            values.update(dict.fromkeys(_info(field).implies, True))
    return _class(options)(**values, **given)


def options_table() -> str:
    """The options as the Markdown table docs/guide.md shows (a test keeps the two the same)."""
    rows = ["| option | default | values | `midlens ask` | what it does |", "|---|---|---|---|---|"]
    for field in _fields():
        info = _info(field)
        bounds = [f"{op} {v:g}" for op, v in ((">=", info.ge), (">", info.gt), ("<=", info.le)) if v is not None]
        values = " ".join(f"`{c}`" for c in info.choices) if info.choices else ", ".join(bounds)
        flag = info.shared_flag if "cli" in info.absent else flag_of(field.name)
        flag = f"`{flag}`" if flag else ""
        rows.append(f"| `{field.name}` | `{field.default!r}` | {values} | {flag} | {info.help} |")
    return "\n".join(rows) + "\n"
