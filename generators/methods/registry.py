"""Methods by name: one registry entry per method, the way transformers registers attention functions.

An entry is a method module's `METHOD` (`generators.methods.method.Method`): what a method is called, its options
and their defaults, how to check them, and how to build the parts it puts into the one attention module. The
built-ins are listed below; other packages add theirs through the entry point group `midlens.methods`, which the
command line reads too. Shells never test a method's name: they pass specs such as
`ms-poe(ratio_min=1.0, ratio_max=1.3)` to `method_config` and get a validated `MethodConfig` back, before any
model is loaded.

    register(Method("my-method", "what it does", defaults={...}, build=my_build))   # in this process only
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from midlens.core.defaults import METHOD_SHORTHANDS
from midlens.core.errors import ArtefactError, MethodConfigError, Remedy, StepSpelling, plain_step
from midlens.core.method_spec import (
    PLUGIN_GROUP,
    entry_points,
    join_method_names,
    parse_method_spec,
    split_top_level,
)
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method

REGISTRY: dict[str, Method] = {}
__all__ = ["REGISTRY", "Method", "MethodConfig", "method_config", "parse_method_spec", "split_top_level"]


def register(method: Method, replace: bool = False) -> Method:
    if method.name in REGISTRY and not replace:
        raise MethodConfigError(f"method {method.name!r} is already registered; pass replace=True to override it.")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", method.name):
        raise MethodConfigError(f"method name {method.name!r}: use lower-case letters, digits, '-', '_' or '.'.")
    REGISTRY[method.name] = method
    join_method_names(method.name)
    return method


def available(model: str | None = None) -> list[str]:
    """Registered method names; with `model` (a registry name or folder), only those that run on it as they come.

    A method with an `artefact` option runs on weights trained for one model (a MuDAF delta, MoICE routers): it
    is listed for `model` only when an artefact ships for that model, so a menu never offers a certain error.
    """
    from midlens.generators.models.packaged_models import canonical_name

    model = None if model is None else canonical_name(model)

    def runs(name: str, options: dict) -> bool:
        options = {**REGISTRY[name].defaults, **options}
        return model is None or not _reads_shipped(name, options) or _shipped_folder(name, model, options) is not None

    named = [name for name in REGISTRY if runs(name, {})]
    # Then the shorthands (core.defaults.METHOD_SHORTHANDS), on the same terms as the spec each stands for.
    return named + [short for short, spec in METHOD_SHORTHANDS.items() if runs(*parse_method_spec(spec))]


def _shipped_name(method: Method, model: str, options: dict) -> str:
    return model if method.shipped_name is None else method.shipped_name(model, options)


def _reads_shipped(name: str, options: dict) -> bool:
    """Whether method `name` run with `options` reads a shipped artefact: it trains one, no folder was given, and
    its other options do not make one unnecessary (channel-scaling given its whole choice reads none)."""
    method = REGISTRY[name]
    if "artefact" not in method.defaults or options.get("artefact") is not None:
        return False
    return method.reads_artefact is None or method.reads_artefact({**method.defaults, **options})


def _shipped_folder(name: str, model: str, options: dict) -> Path | None:
    """The artefact folder shipped for method `name` with `options` on `model`, or None where none ships."""
    from midlens.generators.models.shipped import shipped_artefact

    return shipped_artefact(name, _shipped_name(REGISTRY[name], model, options))


def shipped_models(config: MethodConfig) -> list[str] | None:
    """The packaged models a trained artefact ships for, for this method and options; None when the method reads
    no shipped artefact (it trains nothing, or an artefact folder was given)."""
    from midlens.generators.models.packaged_models import REGISTRY as MODELS

    if not _reads_shipped(config.name, config.options):
        return None
    return [m for m in MODELS if _shipped_folder(config.name, m, config.options) is not None]


def shipped_artefact_of(config: MethodConfig, model: str) -> Path | None:
    """The shipped artefact folder `config` reads on `model` (a registry name); None when it reads none: it trains
    nothing, was given a folder, or nothing ships for that model."""
    if not _reads_shipped(config.name, config.options):
        return None
    return _shipped_folder(config.name, model, config.options)


def model_for(config: MethodConfig, model: str | None, default: str) -> str:
    """The model to run `config` on: `model` when one was chosen, else `default`, or, for a trained method that
    ships nothing for `default`, the packaged model its artefact was trained for (`midlens ask --method mudaf`
    works on a fresh checkout). A chosen model the method has nothing for is refused here, before it loads."""
    from midlens.generators.models.packaged_models import canonical_name

    # An old model name is compared as the name it stands for, or its artefacts would not be found.
    model = None if model is None else canonical_name(model)
    ships = shipped_models(config)
    if ships is None or (model or default) in ships:
        return model or default
    if model is None and ships:
        return ships[0]
    raise missing_artefact(config, model or default, ships)


def check_artefact(config: MethodConfig, model: str) -> None:
    """Refuse `config` on `model` (a registry name, or a folder as the user gave it) when it reads a shipped
    artefact and none ships for that model: from names alone, so before the model loads. The method's own lookup
    would name the folder it looks for under the shipped ones ('<model>-alpha0' for finetuned), which is no model
    anyone asked for."""
    ships = shipped_models(config)
    if ships is not None and shipped_artefact_of(config, model) is None:
        raise missing_artefact(config, model, ships)


def missing_artefact(config: MethodConfig, model: str, ships: list[str]) -> ArtefactError:
    """The refusal of `config` on `model` (a registry name or the folder as the user gave it), for which none of
    the artefacts it reads ships (`ships`: the packaged models one ships for)."""
    shorthand = next((short for short, spec in METHOD_SHORTHANDS.items() if method_config(spec) == config), None)
    remedies = [Remedy("model", m, "(its shipped artefact)") for m in ships]
    # PATH bare: a spec takes an unquoted folder, and every interface can quote the whole spec its own way.
    trained = MethodConfig(config.name, {**config.options, "artefact": "PATH"}).spec().replace("'PATH'", "PATH")
    remedies.append(Remedy("method", trained, f"with PATH a {config.name} artefact trained for {model}"))
    spared = REGISTRY[config.name].artefact_free
    where = (f"; one ships for {', '.join(ships)}" if ships else "") + (
        f"; {config.name} runs without one with {spared}" if spared else ""
    )
    if shorthand is not None:
        return ArtefactError(
            f"method {shorthand!r} ({config.spec()}) reads a trained artefact, which ships only for the packaged "
            f"models: model {model!r} has none{where}.",
            remedies,
        )
    return ArtefactError(f"no trained {config.name} artefact ships for model {model!r}{where}.", remedies)


@dataclass(frozen=True)
class MethodConfig:
    """A validated method: its registry name and every option (defaults filled in)."""

    name: str = "baseline"
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, **self.options}

    def spec(self) -> str:
        """The spec that rebuilds this config, listing only options that differ from the defaults."""
        defaults = REGISTRY[self.name].defaults if self.name in REGISTRY else {}
        changed = {k: v for k, v in self.options.items() if defaults.get(k, object()) != v}
        if not changed:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


def method_config(spec: str | MethodConfig = "baseline", options: dict | None = None) -> MethodConfig:
    """A method name or spec (+ keyword options, which win) -> a validated MethodConfig with defaults filled in.

    Only this function makes MethodConfigs, so one passed back without options is returned as it is: a spec is
    validated once, where the shell first turns it into a config, however many layers it then passes through."""
    if isinstance(spec, MethodConfig) and not options:
        return spec
    if isinstance(spec, MethodConfig):
        name, given = spec.name, dict(spec.options)
    else:
        name, given = parse_method_spec(spec)
    given.update(options or {})
    if name not in REGISTRY:
        raise MethodConfigError(f"unknown method {name!r}: choose one of {', '.join(REGISTRY)}.")
    method = REGISTRY[name]
    unknown = sorted(set(given) - set(method.defaults))
    if unknown:
        valid = ", ".join(method.defaults) or "none"
        raise MethodConfigError(f"unknown {name} option(s) {unknown}; valid options: {valid}.")
    merged = {**method.defaults, **given}
    if method.check is not None:
        method.check(merged)
    return MethodConfig(name, merged)


def unsupported_reason(name: str, model) -> str | None:
    """Why method `name` cannot run on `model` (a loaded causal LM), or None when it can."""
    method = REGISTRY[name]
    return None if method.unsupported is None else method.unsupported(model)


def support_on(loaded, steps: StepSpelling = plain_step) -> dict[str, str | None]:
    """Every registered method -> None when it runs on `loaded` as it comes, else why it does not: what the model's
    layers do that it does not handle, or the trained artefact it lacks for this model (with the step that trains
    one, worded by `steps`: an interface's own)."""
    from midlens.core.saved_parts import train_step

    out: dict[str, str | None] = {}
    for name, method in REGISTRY.items():
        reason = unsupported_reason(name, loaded.model)
        if (
            reason is None
            and _reads_shipped(name, method.defaults)
            and _shipped_folder(name, loaded.name, method.defaults) is None
        ):
            how = steps(train_step(name, loaded.name)) if method.trainer else "pass a trained one as artefact=FOLDER"
            reason = f"needs an artefact trained for this model ({how})"
            if method.artefact_free:
                reason += f", or {method.artefact_free}"
        out[name] = reason
    return out


def build_parts(config: MethodConfig, loaded) -> MethodParts:
    """The per-layer parts of `config` for one loaded model, created on the model's device."""
    reason = unsupported_reason(config.name, loaded.model)
    if reason is not None:
        raise MethodConfigError(f"method {config.name!r} cannot run on model {loaded.name!r}: {reason}.")
    check_artefact(config, loaded.name)
    parts = REGISTRY[config.name].build(loaded, dict(config.options))
    device = loaded.device
    for scheme in parts.schemes:
        scheme.to(device)
    if parts.delta is not None:
        parts.delta.to(device)
    return parts


# The built-in methods, in the order shells list them (core.defaults.METHODS spells the same names without torch).
BUILTIN_MODULES = (
    "midlens.generators.methods.baseline",
    "midlens.generators.methods.ms_poe",
    "midlens.generators.methods.mudaf",
    "midlens.generators.methods.moice",
    "midlens.generators.methods.attn_calibration",
    "midlens.generators.methods.attention_buckets",
    "midlens.generators.methods.channel_scaling",
    "midlens.generators.methods.rope_scaling",
    "midlens.generators.methods.pos2distill",
)


def _register_builtins() -> None:
    for module in BUILTIN_MODULES:
        register(_method_of(importlib.import_module(module).METHOD, module))


def _method_of(value: object, source: str) -> Method:
    if not isinstance(value, Method):
        raise MethodConfigError(
            f"{source} does not name a midlens Method (got {type(value).__name__}); a method module exports "
            "METHOD = Method(...) from midlens.generators.methods.method."
        )
    return value


def _register_plugins() -> None:
    """Methods other packages declare in the entry point group `midlens.methods` (NAME = "module:METHOD")."""
    for entry in entry_points(group=PLUGIN_GROUP):
        where = f"entry point {entry.name!r} = {entry.value!r} (group {PLUGIN_GROUP})"
        try:
            value = entry.load()
        except Exception as err:  # a broken plugin is named, not a traceback from inside it
            raise MethodConfigError(f"{where} could not be loaded: {type(err).__name__}: {err}") from err
        method = _method_of(value, where)
        if method.name != entry.name:
            raise MethodConfigError(f"{where} holds a method named {method.name!r}; name the entry point after it.")
        if method.name in REGISTRY:
            raise MethodConfigError(f"{where}: a method named {method.name!r} is already registered.")
        register(method)


_register_builtins()
_register_plugins()
