"""Attention Buckets (Chen et al. 2023, "Fortify the Shortest Stave in Attention"): N instances of the model,
each with its own RoPE base for every layer, whose next-token logits are mixed at every decode step with
weights softmax_j(max_v logits_j[v]) (the most confident instance counts most).

    Generator(m, method="attention-buckets")               # 4 bases, chosen for this model
    Generator(m, method="attention-buckets(buckets=6)")
    Generator(m, method="attention-buckets(bases=[10000, 17500, 25000])")

Published implementations run the N instances as N separate inference passes. Here they are N rows of one batch:
each prompt becomes N consecutive rows (`context.Instances`), one scheme per layer rotates row r with base
r % N, and the generator mixes the rows' logits per prompt. Cost: N times the compute and the KV cache of a plain
answer. The bases are not the published Llama-2 set (searched for head_dim 128 and base 1e4): they are derived
for each model's head_dim and native base with the Attention-Buckets criterion (`rope_bases.complementary_bases`:
the native base first, then bases whose attention waveform peaks where the set's troughs are), deterministic
given (model, buckets), and shown by `midlens methods attention-buckets`. Evidence is the instances' maps
weighted by their mixing weights (`generators.methods.instances`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.anatomy import layer_ropes, plain_rope_problem, rope_scope
from midlens.generators.attention.rope import LayerRope, RotaryScheme, apply_rotary, layer_inv_freq, scaled_tables
from midlens.generators.methods.install import Instances, MethodParts
from midlens.generators.methods.method import Method, Options
from midlens.generators.methods.rope_bases import complementary_bases, head_dim_of, rope_base, rotary_dim_of

# 4 bases by default, not the paper's larger sets: each base is a full instance (N x the compute and KV cache),
# and 4 already spans the 1x-2.5x range the published set covers.
DEFAULTS: Options = {"buckets": 4, "bases": None}
BENCH_VARIANTS = ("attention-buckets",)


class BucketScheme(RotaryScheme):
    """The layer's RoPE with a base that depends on the batch row: row r rotates with base r % N (instance r % N).

    `bases` are this layer's; `head_dim` the channels it rotates. With the layer's `rope`, a scaled schedule gets
    each base as a change of its own (current) frequencies (`generators.attention.rope.rebase`) and its attention
    scaling, and rows whose base is the layer's native one use the model's own tables, so that instance is the stock
    model."""

    def __init__(
        self, bases: list[float], head_dim: int, num_heads: int, num_kv_heads: int, rope: LayerRope | None = None
    ):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        inv_freqs = torch.stack([torch.tensor(b, dtype=torch.float64) ** -exponents for b in bases]).float()
        super().__init__(inv_freqs[0], num_heads, num_kv_heads, rope)
        self.register_buffer("bucket_inv_freq", inv_freqs, persistent=False)  # [N, d/2]
        self.bases = list(bases)
        native = [rope is not None and b == rope.native_base for b in self.bases]
        self.register_buffer("native", torch.tensor(native), persistent=False)  # [N]: the instance is the stock model

    def rotate(self, q, k, positions, position_embeddings):
        rows = torch.arange(q.shape[0], device=q.device) % len(self.bases)
        if self.rope is not None and not self.rope.plain:
            table, scaling = self.rope.rebased(self.bases), self.frequencies()[1]
        else:
            table, scaling = self.bucket_inv_freq, 1.0
        cos, sin = scaled_tables(positions, table[rows][:, None], scaling, q.dtype)  # [B, 1, L, d]: a base per row
        if position_embeddings is not None and bool(self.native.any()):
            stock = self.native.to(q.device)[rows][:, None, None, None]
            cos = torch.where(stock, position_embeddings[0][:, None], cos)
            sin = torch.where(stock, position_embeddings[1][:, None], sin)
        return apply_rotary(q, cos, sin)[None], apply_rotary(k, cos, sin)[None]


def mix_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, ..., V] -> (the weighted sum of the instances' logits [B, ..., V], the weights [B, N, ...]), weights
    softmax over instances of each instance's largest logit (Attention Buckets' rule)."""
    logits = logits.float()
    weights = torch.softmax(logits.amax(-1), dim=1)
    return (weights[..., None] * logits).sum(1), weights


def bucket_bases(config, count: int, rotary_dim: int | None = None) -> list[float]:
    """The `count` bases for a model: its reference base (`rope_bases.rope_base`), then the complementary ones for
    the channels its layers rotate (`rotary_dim`, default head_dim)."""
    return complementary_bases(rope_base(config, "attention-buckets"), rotary_dim or head_dim_of(config), count)


def check_options(opts: Options) -> None:
    count, bases = opts["buckets"], opts["bases"]
    if bases is None:
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise MethodConfigError(
                f"attention-buckets buckets={count!r}: the number of RoPE bases (model instances) must be a whole "
                "number >= 1; 1 is the baseline, the default is 4."
            )
        return
    if not isinstance(bases, list | tuple) or not bases or not all(_positive(b) for b in bases):
        raise MethodConfigError(
            f"attention-buckets bases={bases!r}: give a non-empty list of positive RoPE bases, e.g. bases=[10000, "
            "17500, 25000], or leave bases out to derive `buckets` of them for the model."
        )


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def build(loaded, opts: Options) -> MethodParts:
    """Bases given or chosen for the model's reference base, carried to each RoPE layer's own base by their ratio
    (Gemma 3's local layers); a NoPE layer rotates nothing, so every instance runs it the same."""
    model = loaded.model
    config = model.config
    if opts["bases"] is not None:
        bases = [float(b) for b in opts["bases"]]
    else:
        bases = bucket_bases(config, opts["buckets"], rotary_dim_of(model))
    reference = rope_base(config, "attention-buckets")
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    schemes: list[RotaryScheme] = []
    for i, rope in enumerate(layer_ropes(model)):
        if rope is None:
            schemes.append(RotaryScheme(layer_inv_freq(model, i), heads, kv_heads))
            continue
        layer_bases = rope.scaled_bases(bases, reference)
        schemes.append(BucketScheme(layer_bases, rope.rotary_dim, heads, kv_heads, rope).to(loaded.device))
    return MethodParts(schemes, instances=Instances(len(bases), mix_logits))


def inspect_bases(gen, prompts: list, out: Path | None = None) -> list[str]:
    """`midlens methods attention-buckets`: the bases this model runs, and their waveforms as a PNG."""
    from midlens.generators.methods.rope_bases import plot_waveforms

    scheme = next(s for s in gen.parts.schemes if isinstance(s, BucketScheme))  # the first RoPE layer's
    head_dim = rotary_dim_of(gen.loaded.model)
    lines = [
        f"{gen.loaded.name}: head_dim {head_dim}, {len(scheme.bases)} instances, RoPE bases "
        + ", ".join(f"{b:g}" for b in scheme.bases)
        + f" (native first); cost {len(scheme.bases)}x a plain answer's compute and KV cache"
    ]
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / "attention_buckets_bases.png"
        plot_waveforms(scheme.bases, head_dim, path, title="the Attention Buckets instances")
        lines.append(f"waveforms: {path}")
    return lines


METHOD = Method(
    "attention-buckets",
    "N instances with different RoPE bases as batch rows, logits mixed per step (Chen et al. 2023)",
    build=build,
    unsupported=plain_rope_problem,
    scope=rope_scope,
    cost=lambda opts: len(opts["bases"]) if opts["bases"] is not None else opts["buckets"],
    defaults=DEFAULTS,
    check=check_options,
    bench_variants=BENCH_VARIANTS,
    inspect=inspect_bases,
)
