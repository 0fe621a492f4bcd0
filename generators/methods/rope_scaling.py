"""RoPE scaling baselines the MoICE paper compares against: Position Interpolation (Chen et al. 2023, positions
divided by a factor, i.e. every frequency divided by it) and NTK-aware scaling (the base raised to
base * factor^(d / (d - 2)), which stretches the low frequencies and keeps the highest one).

    Generator(m, method="rope-scaling")                     # PI, factor 1.5
    Generator(m, method="rope-scaling(kind='ntk', factor=2.0)")

Both are one plain RoPE scheme with other frequencies, the same on every layer and head (Ms-PoE is the per-head
version of PI). Dynamic NTK is not a separate entry: it scales only once a sequence passes the trained window
(factor = max(1, ...) of the length over max_position_embeddings), so on every prompt that fits the window it is
the baseline, exactly.
"""

from __future__ import annotations

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.anatomy import plain_rope_problem
from midlens.generators.context import MethodParts
from midlens.generators.methods.method import Method, Options
from midlens.generators.methods.rope_bases import head_dim_of, rope_base
from midlens.generators.rope import RotaryScheme

KINDS = ("linear", "ntk")
# 1.5: the middle of Ms-PoE's ratio ladder (1.2-1.8), so the uniform and the per-head rescaling compare at the
# same average compression.
DEFAULTS: Options = {"kind": "linear", "factor": 1.5}


class ScaledRotary(RotaryScheme):
    """Plain RoPE with its own frequencies: never the model's cached tables, which hold the native ones."""

    def rotate(self, q, k, positions, position_embeddings):
        return super().rotate(q, k, positions, None)


def scaled_inv_freq(base: float, head_dim: int, kind: str, factor: float) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    if kind == "ntk":
        base = base * factor ** (head_dim / (head_dim - 2))
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
    config = loaded.model.config
    head_dim = head_dim_of(config)
    inv_freq = scaled_inv_freq(rope_base(config, "rope-scaling"), head_dim, opts["kind"], float(opts["factor"]))
    schemes = [
        ScaledRotary(inv_freq, config.num_attention_heads, config.num_key_value_heads).to(loaded.device)
        for _ in range(config.num_hidden_layers)
    ]
    return MethodParts(schemes)


METHOD = Method(
    "rope-scaling",
    "Position Interpolation or NTK-aware RoPE scaling, one factor for every layer and head",
    build=build,
    unsupported=plain_rope_problem,
    defaults=DEFAULTS,
    check=check_options,
)
