"""RoPE scaling baselines the MoICE paper compares against: Position Interpolation (Chen et al. 2023, positions
divided by a factor, i.e. every frequency divided by it) and NTK-aware scaling (the base raised to
base * factor^(d / (d - 2)), which stretches the low frequencies and keeps the highest one).

    Generator(m, method="rope-scaling")                     # PI, factor 1.5
    Generator(m, method="rope-scaling(kind='ntk', factor=2.0)")

Both change each RoPE layer's own schedule the same way on every layer and head (Ms-PoE is the per-head version of
PI): PI divides the layer's (possibly already scaled) frequencies by the factor, NTK changes its base by the
per-channel ratio of `generators.attention.rope.rebase`, and the layer's attention scaling is kept; NoPE layers are left
as they are. Dynamic NTK is not a separate entry: it scales only once a sequence passes the trained window
(factor = max(1, ...) of the length over max_position_embeddings), so on every prompt that fits the window it is
the baseline, exactly.
"""

from __future__ import annotations

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.anatomy import layer_ropes, plain_rope_problem, rope_scope
from midlens.generators.attention.rope import LayerRope, RotaryScheme, apply_rotary, layer_inv_freq, scaled_tables
from midlens.generators.methods.install import MethodParts
from midlens.generators.methods.method import Method, Options

KINDS = ("linear", "ntk")
# 1.5: the middle of Ms-PoE's ratio ladder (1.2-1.8), so the uniform and the per-head rescaling compare at the
# same average compression.
DEFAULTS: Options = {"kind": "linear", "factor": 1.5}


class ScaledRotary(RotaryScheme):
    """The layer's RoPE with scaled frequencies: `inv_freq` already scaled for a plain layer; a scaled layer's `rope`
    is scaled again at each forward (its frequencies may change per forward: dynamic NTK, LongRoPE)."""

    def __init__(
        self,
        inv_freq: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        rope: LayerRope | None = None,
        kind: str = "linear",
        factor: float = 1.0,
    ):
        super().__init__(inv_freq, num_heads, num_kv_heads, rope)
        self.kind, self.factor = kind, factor

    def rotate(self, q, k, positions, position_embeddings):
        if self.factor == 1.0 and position_embeddings is not None:  # the identity case: the model's own tables
            return super().rotate(q, k, positions, position_embeddings)
        if self.rope is not None and not self.rope.plain:
            native = self.rope.native_base
            if self.kind == "ntk":
                inv_freq = self.rope.rebased([ntk_base(native, self.rope.rotary_dim, self.factor)])[0]
            else:
                inv_freq = self.rope.rebased([native], divide=self.factor)[0]
            scaling = self.frequencies()[1]
        else:
            inv_freq, scaling = self.inv_freq, 1.0
        cos, sin = scaled_tables(positions, inv_freq[None], scaling, q.dtype)
        return apply_rotary(q, cos, sin)[None], apply_rotary(k, cos, sin)[None]


def ntk_base(base: float, rotary_dim: int, factor: float) -> float:
    """NTK-aware scaling's new base: base * factor^(d / (d - 2)), which divides the lowest frequency by the factor."""
    return base * factor ** (rotary_dim / (rotary_dim - 2))


def scaled_inv_freq(base: float, head_dim: int, kind: str, factor: float) -> torch.Tensor:
    """A plain schedule of `base` over `head_dim` rotated channels, scaled (PI: divided; NTK: rebased)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    if kind == "ntk":
        base = ntk_base(base, head_dim, factor)
    inv_freq = base**-exponents
    return (inv_freq / factor if kind == "linear" else inv_freq).float()


def check_options(opts: Options) -> None:
    if opts["kind"] not in KINDS:
        raise MethodConfigError(
            f"rope-scaling kind={opts['kind']!r}: choose 'linear' (Position Interpolation) or 'ntk' (NTK-aware base)."
        )
    factor = opts["factor"]
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
        raise MethodConfigError(
            f"rope-scaling factor={factor!r}: a positive number (1.0 is the baseline; > 1 compresses positions)."
        )


def build(loaded, opts: Options) -> MethodParts:
    model = loaded.model
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    kind, factor = opts["kind"], float(opts["factor"])
    schemes: list[RotaryScheme] = []
    for i, rope in enumerate(layer_ropes(model)):
        if rope is None:  # a NoPE layer: nothing to scale
            schemes.append(RotaryScheme(layer_inv_freq(model, i), heads, kv_heads))
            continue
        # A plain layer's scaled schedule is fixed: computed once, from its base, as before.
        inv_freq = scaled_inv_freq(rope.native_base, rope.rotary_dim, kind, factor)
        schemes.append(ScaledRotary(inv_freq, heads, kv_heads, rope, kind, factor).to(loaded.device))
    return MethodParts(schemes)


METHOD = Method(
    "rope-scaling",
    "Position Interpolation or NTK-aware RoPE scaling, one factor for every layer and head",
    build=build,
    unsupported=plain_rope_problem,
    scope=rope_scope,
    defaults=DEFAULTS,
    check=check_options,
)
