"""Methods by name: one registry entry per method, the way transformers registers attention functions.

An entry says what a method is called, its options and their defaults, how to check them, and how to build
the parts it puts into the one attention module (`MethodParts`: a scheme per layer, an optional weight
delta). Shells never test a method's name: they pass specs such as `ms-poe(ratio_min=1.0, ratio_max=1.3)`
to `method_config` and get a validated `MethodConfig` back, before any model is loaded.

    register(Method("my-method", "what it does", defaults={...}, build=my_build))   # a user's own method
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from midlens.core.errors import MethodConfigError
from midlens.core.method_spec import parse_method_spec, split_top_level
from midlens.generators.context import MethodParts
from midlens.generators.rope import baseline_schemes


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    build: Callable[[Any, dict], MethodParts]  # (LoadedModel, merged options) -> parts
    defaults: dict = field(default_factory=dict)
    check: Callable[[dict], None] | None = None  # raises MethodConfigError on a bad combination of options
    # Methods with an `artefact` option: the folder under generators/trained/<name>/ that (model name, options)
    # reads when no artefact is given. None: the model's name (MuDAF keeps one folder per alpha).
    shipped_name: Callable[[str, dict], str] | None = None
    # `midlens bench NAME`: the specs timed against the baseline, and the default prompt sizes (tokens).
    bench_variants: tuple[str, ...] = ()
    bench_tokens: tuple[int, ...] = (2048,)
    # `midlens methods NAME`: what the method shows of itself on a loaded model, (Generator, prompts, out folder or
    # None) -> lines to print; it may write figures into the folder. None: its options say all there is.
    inspect: Callable[[Any, list, Any], list[str]] | None = None
    # `midlens train NAME`: the module holding the method's training recipe (`RECIPE`, midlens.training.recipe),
    # named, not imported: training sits above this layer. None: the method learns nothing.
    trainer: str | None = None


REGISTRY: dict[str, Method] = {}
__all__ = ["REGISTRY", "Method", "MethodConfig", "method_config", "parse_method_spec", "split_top_level"]


def register(method: Method, replace: bool = False) -> Method:
    if method.name in REGISTRY and not replace:
        raise MethodConfigError(f"method {method.name!r} is already registered; pass replace=True to override it.")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", method.name):
        raise MethodConfigError(f"method name {method.name!r}: use lower-case letters, digits, '-', '_' or '.'.")
    REGISTRY[method.name] = method
    return method


def available(model: str | None = None) -> list[str]:
    """Registered method names; with `model` (a registry name or folder), only those that run on it as they come.

    A method with an `artefact` option runs on weights trained for one model (a MuDAF delta, MoICE routers): it
    is listed for `model` only when an artefact ships for that model, so a menu never offers a certain error.
    """
    from midlens.generators.artefacts import shipped_artefact

    return [
        name
        for name, method in REGISTRY.items()
        if model is None
        or "artefact" not in method.defaults
        or shipped_artefact(name, _shipped_name(method, model, method.defaults)) is not None
    ]


def _shipped_name(method: Method, model: str, options: dict) -> str:
    return model if method.shipped_name is None else method.shipped_name(model, options)


def shipped_models(config: MethodConfig) -> list[str] | None:
    """The packaged models a trained artefact ships for, for this method and options; None when the method reads
    no shipped artefact (it trains nothing, or an artefact folder was given)."""
    from midlens.generators.artefacts import shipped_artefact
    from midlens.generators.packaged_models import REGISTRY as MODELS

    method = REGISTRY[config.name]
    if "artefact" not in method.defaults or config.options.get("artefact") is not None:
        return None
    return [m for m in MODELS if shipped_artefact(config.name, _shipped_name(method, m, config.options)) is not None]


def model_for(config: MethodConfig, model: str | None, default: str) -> str:
    """The model to run `config` on: `model` when one was chosen, else `default`, or, for a trained method that
    ships nothing for `default`, the packaged model its artefact was trained for (`midlens ask --method mudaf`
    works on a fresh checkout). A chosen model the method has nothing for is refused here, before it loads."""
    from midlens.core.errors import ArtefactError

    ships = shipped_models(config)
    if ships is None or (model or default) in ships:
        return model or default
    if model is None and ships:
        return ships[0]
    chosen = model or default
    where = f"; one ships for {', '.join(ships)} (choose that model)" if ships else ""
    raise ArtefactError(
        f"no trained {config.name} artefact ships for model {chosen!r}{where}. To run {config.name} on {chosen}, train "
        f"one (`midlens train {config.name}` with that model) and pass its folder in the method spec: "
        f"{MethodConfig(config.name, {**config.options, 'artefact': 'PATH'}).spec()}."
    )


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


def build_parts(config: MethodConfig, loaded) -> MethodParts:
    """The per-layer parts of `config` for one loaded model, created on the model's device."""
    parts = REGISTRY[config.name].build(loaded, dict(config.options))
    device = loaded.device
    for scheme in parts.schemes:
        scheme.to(device)
    if parts.delta is not None:
        parts.delta.to(device)
    return parts


def _build_baseline(loaded, options: dict) -> MethodParts:
    return MethodParts(baseline_schemes(loaded.model))


def _register_builtins() -> None:
    from midlens.generators.methods import attn_calibration, moice, ms_poe, mudaf

    register(Method("baseline", "the model's own RoPE, nothing changed", build=_build_baseline))
    # Each method module holds its DEFAULTS, check_options and build; the summaries are what `midlens methods` shows.
    for name, module, summary in (
        ("ms-poe", ms_poe, "training-free per-head position rescaling (Zhang et al. 2024)"),
        (
            "mudaf",
            mudaf,
            "contrastively tuned retrieval heads, a trained LoRA delta (Liu et al. 2025); alpha=0: plain fine-tuning",
        ),
        (
            "moice",
            moice,
            "trained routers mix attention over several RoPE bases per token and head (Lin et al. 2024)",
        ),
        (
            "attn-calibration",
            attn_calibration,
            "training-free: answer-time attention moved toward position-calibrated relevance (Hsieh et al. 2024)",
        ),
    ):
        shipped = getattr(module, "shipped_name", None)
        bench = getattr(module, "BENCH_VARIANTS", ())
        tokens = getattr(module, "BENCH_TOKENS", (2048,))
        register(
            Method(
                name,
                summary,
                module.build,
                module.DEFAULTS,
                module.check_options,
                shipped_name=shipped,
                bench_variants=bench,
                bench_tokens=tokens,
                inspect=getattr(module, "inspect", None),
                trainer=getattr(module, "TRAINER", None),
            )
        )


_register_builtins()
