"""Method specs as text, `NAME` or `NAME(option=value, ...)`: parsed without torch, so shells refuse a
misspelt method name at once (generators.methods.registry validates the options against the method's defaults)."""

from __future__ import annotations

import ast
import re
from importlib import metadata

from midlens.core.defaults import METHOD_SHORTHANDS, METHODS
from midlens.core.errors import MethodConfigError, Remedy

# Where other packages declare their methods: `[project.entry-points."midlens.methods"] NAME = "module:METHOD"`.
PLUGIN_GROUP = "midlens.methods"

# Methods registered in this process (generators.methods.registry.register): a name joins here as it is
# registered, so the torch-free checks accept what the registry will run, with no second list to keep.
_REGISTERED_IN_PROCESS: list[str] = []

_SPEC = re.compile(r"^\s*([\w.-]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def parse_method_spec(spec: str) -> tuple[str, dict]:
    """`ms-poe(ratio_min=1.0, ratio_max=1.2)` -> ("ms-poe", {"ratio_min": 1.0, "ratio_max": 1.2}).

    Values are Python literals (numbers, lists, None); anything else is taken as a bare string
    (`head_order=sequential`). Names are checked by method_config. A shorthand (`finetuned`,
    core.defaults.METHOD_SHORTHANDS) comes back as the spec it stands for, its own options on top.
    """
    match = _SPEC.match(spec or "")
    if not match:
        raise MethodConfigError(f"method spec {spec!r}: expected NAME or NAME(option=value, ...).")
    name, body = match.group(1), (match.group(2) or "").strip()
    options: dict = {}
    for item in split_top_level(body) if body else []:
        key, eq, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not eq or not key.isidentifier() or not raw:
            raise MethodConfigError(f"method spec {spec!r}: {item.strip()!r} is not option=value.")
        try:
            options[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            options[key] = raw
    if name in METHOD_SHORTHANDS:
        full_name, preset = parse_method_spec(METHOD_SHORTHANDS[name])
        return full_name, {**preset, **options}
    return name, options


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets: "a,b(x=1,y=[2,3]),c" -> ["a", "b(x=1,y=[2,3])", "c"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def entry_points(group: str = PLUGIN_GROUP) -> list[metadata.EntryPoint]:
    """The installed entry points of `group`, read from package metadata (nothing is imported)."""
    return sorted(metadata.entry_points(group=group), key=lambda e: e.name)


def method_names() -> tuple[str, ...]:
    """Every method a shell may name: the built-ins, those installed packages declare (no torch import), then those
    registered in this process."""
    names = METHODS + tuple(e.name for e in entry_points() if e.name not in METHODS)
    return names + tuple(n for n in _REGISTERED_IN_PROCESS if n not in names)


def join_method_names(name: str) -> None:
    """Make `name` known to the torch-free checks (AnswerOptions, the shells' parsers): the registry calls this for
    every method it registers, in-process plug-ins included."""
    if name not in _REGISTERED_IN_PROCESS:
        _REGISTERED_IN_PROCESS.append(name)


def parse_known_specs(specs: list[str], also: tuple[str, ...] = ()) -> dict[str, tuple[str, dict]]:
    """Each spec parsed once (spec -> (name, options)), a name that is no registered method (or one of `also`)
    refused before anything heavy is imported. `method_config(name, options)` then validates the options."""
    known = method_names() + also
    parsed = {spec: parse_method_spec(spec) for spec in specs}
    for name, _ in parsed.values():
        if name not in known:
            raise MethodConfigError(f"unknown method {name!r}: choose one of {', '.join(known)}.")
    return parsed


def parse_scorer_spec(spec: object, option: str = "restack", purpose: str = "restacking") -> tuple[str, dict]:
    """The method spec whose evidence scores passages (`mudaf`, `mudaf(alpha=0)`) for `purpose` (restacking, or
    the evidence citations blend in), parsed and its name checked without torch; the error names `option`, so every
    interface says which of its settings was wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise MethodConfigError(
            f"{purpose} needs the method whose evidence scores the passages, e.g. mudaf or baseline.",
            about=Remedy(option, spec),
        )
    try:
        name, options = parse_method_spec(spec)
    except MethodConfigError as err:
        raise MethodConfigError(err.problem, about=Remedy(option, spec)) from None
    known = method_names()
    if name not in known:
        raise MethodConfigError(
            f"{purpose} scores the passages with a method's evidence, and {name!r} is no method: choose one of "
            f"{', '.join(known)}.",
            about=Remedy(option, spec),
        )
    return name, options


def check_cite_evidence(spec: str | None) -> str | None:
    """The `cite_evidence` setting (the method whose evidence citations blend in, `CitationConfig.evidence_from`),
    checked without torch in its own name, whichever interface it was given to; None (the answering pass's own)
    passes."""
    if spec is not None:
        parse_scorer_spec(spec, "cite_evidence", "citing")
    return spec


RESTACK_MARK = "+restack("  # what a restacked system's label adds to its method's


def restacked_label(method: str, scorer: str, rounds: int, slots: str = "measured") -> str:
    """What a restacked system is called in runs and reports: `baseline+restack(mudaf)`, with `, rounds=N` past 1
    and `, slots=first` for a slot policy other than the measured order."""
    extra = ("" if rounds == 1 else f", rounds={rounds}") + ("" if slots == "measured" else f", slots={slots}")
    return f"{method}{RESTACK_MARK}{scorer}{extra})"
