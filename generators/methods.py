"""Method name + options -> one RotaryScheme per layer. The only place that knows the method names."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from generators.ms_poe import MsPoEScheme
from generators.rope import RotaryScheme
from rag.errors import MethodConfigError

METHODS = ("baseline", "ms-poe", "moice", "mudaf")
BUILT = ("baseline", "ms-poe")

MS_POE_DEFAULTS = {
    "ratio_min": 1.2,
    "ratio_max": 1.8,
    "layers": None,  # None = layer 2 to the last, as the official `apply_layers`
    "head_order": "awareness",
    "gqa": "group",
    "alpha": 3.0,
    "head_ranks": None,
}


@dataclass
class MethodConfig:
    name: str = "baseline"
    options: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, **self.options}


_SPEC = re.compile(r"^\s*([\w-]+)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def parse_method_spec(spec: str) -> tuple[str, dict]:
    """`ms-poe(ratio_min=1.0, ratio_max=1.2)` -> ("ms-poe", {"ratio_min": 1.0, "ratio_max": 1.2}).

    How an evaluation names method variants for ablations. Values are Python literals (numbers, lists,
    None); anything else is taken as a bare string (`head_order=sequential`). Names are checked later,
    by method_config.
    """
    match = _SPEC.match(spec)
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


def method_config(name: str, options: dict | None = None) -> MethodConfig:
    """Validate a method name and its options; fill in the defaults."""
    options = dict(options or {})
    if name not in METHODS:
        raise MethodConfigError(f"unknown method '{name}': choose one of {', '.join(METHODS)}.")
    if name not in BUILT:
        raise MethodConfigError(
            f"method '{name}' is not built yet (available: {', '.join(BUILT)}); it is planned as a "
            "parameterisation of the same attention module."
        )
    if name == "baseline":
        if options:
            raise MethodConfigError(f"method 'baseline' takes no options, got: {', '.join(options)}.")
        return MethodConfig(name)
    unknown = set(options) - set(MS_POE_DEFAULTS)
    if unknown:
        raise MethodConfigError(f"unknown ms-poe option(s) {sorted(unknown)}; valid: {', '.join(MS_POE_DEFAULTS)}.")
    merged = {**MS_POE_DEFAULTS, **options}
    lo, hi = merged["ratio_min"], merged["ratio_max"]
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float))) or lo <= 0 or hi <= 0:
        raise MethodConfigError(f"ms-poe ratios must be positive numbers, got ratio_min={lo}, ratio_max={hi}.")
    if lo > hi:
        raise MethodConfigError(f"ms-poe ratio_min={lo} is larger than ratio_max={hi}; swap them.")
    if merged["head_order"] not in ("awareness", "sequential", "fixed"):
        raise MethodConfigError(f"ms-poe head_order={merged['head_order']!r}: expected awareness, sequential or fixed.")
    if merged["gqa"] not in ("group", "per_query_head"):
        raise MethodConfigError(f"ms-poe gqa={merged['gqa']!r}: expected group or per_query_head.")
    if merged["head_order"] == "fixed" and merged["head_ranks"] is None:
        raise MethodConfigError(
            "ms-poe head_order='fixed' needs head_ranks: the rank (0 = smallest ratio) of each head."
        )
    return MethodConfig(name, merged)


def build_schemes(config: MethodConfig, model) -> list[RotaryScheme]:
    cfg = model.config
    num_layers, heads, kv_heads = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads
    inv_freq = model.model.rotary_emb.inv_freq
    if config.name == "baseline":
        return [RotaryScheme(inv_freq, heads, kv_heads) for _ in range(num_layers)]
    rope_type = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type in ("dynamic", "yarn", "longrope"):
        # These rescale frequencies per sequence length or scale the tables; per-head ratios on top are untested.
        raise MethodConfigError(f"{config.name} does not support rope_type '{rope_type}' models yet.")
    opts = config.options
    layers = opts["layers"] if opts["layers"] is not None else list(range(2, num_layers))
    bad = [i for i in layers if not (isinstance(i, int) and 0 <= i < num_layers)]
    if bad:
        raise MethodConfigError(f"ms-poe layers {bad} out of range: this model has layers 0..{num_layers - 1}.")
    ranks = opts["head_ranks"]
    if ranks is not None:
        units = kv_heads if opts["gqa"] == "group" else heads
        if sorted(ranks) != list(range(units)):
            raise MethodConfigError(
                f"ms-poe head_ranks={ranks} must be a permutation of 0..{units - 1} "
                f"(one rank per {'kv group' if opts['gqa'] == 'group' else 'query head'})."
            )
    schemes: list[RotaryScheme] = []
    for i in range(num_layers):
        if i in layers:
            schemes.append(
                MsPoEScheme(
                    inv_freq,
                    heads,
                    kv_heads,
                    ratio_min=float(opts["ratio_min"]),
                    ratio_max=float(opts["ratio_max"]),
                    head_order=opts["head_order"],
                    gqa=opts["gqa"],
                    alpha=float(opts["alpha"]),
                    head_ranks=ranks,
                )
            )
        else:
            schemes.append(RotaryScheme(inv_freq, heads, kv_heads))
    return schemes
