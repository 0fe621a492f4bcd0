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
weighted by their mixing weights (`generators.instances`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.anatomy import plain_rope_problem
from midlens.generators.context import Instances, MethodParts
from midlens.generators.methods.method import Method, Options
from midlens.generators.methods.rope_bases import complementary_bases, head_dim_of, rope_base
from midlens.generators.rope import RotaryScheme, apply_rotary, rotary_tables

# 4 bases by default, not the paper's larger sets: each base is a full instance (N x the compute and KV cache),
# and 4 already spans the 1x-2.5x range the published set covers.
DEFAULTS: Options = {"buckets": 4, "bases": None}
BENCH_VARIANTS = ("attention-buckets",)


class BucketScheme(RotaryScheme):
    """Plain RoPE whose base depends on the batch row: row r rotates with base r % N (instance r % N)."""

    def __init__(self, bases: list[float], head_dim: int, num_heads: int, num_kv_heads: int):
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        inv_freqs = torch.stack([torch.tensor(b, dtype=torch.float64) ** -exponents for b in bases]).float()
        super().__init__(inv_freqs[0], num_heads, num_kv_heads)
        self.register_buffer("bucket_inv_freq", inv_freqs, persistent=False)  # [N, d/2]
        self.bases = list(bases)

    def rotate(self, q, k, positions, position_embeddings):
        rows = torch.arange(q.shape[0], device=q.device) % len(self.bases)
        cos, sin = rotary_tables(positions, self.bucket_inv_freq[rows][:, None])  # [B, 1, L, d]: one base per row
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return apply_rotary(q, cos, sin)[None], apply_rotary(k, cos, sin)[None]


def mix_logits(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, N, ..., V] -> (the weighted sum of the instances' logits [B, ..., V], the weights [B, N, ...]), weights
    softmax over instances of each instance's largest logit (Attention Buckets' rule)."""
    logits = logits.float()
    weights = torch.softmax(logits.amax(-1), dim=1)
    return (weights[..., None] * logits).sum(1), weights


def bucket_bases(config, count: int) -> list[float]:
    """The `count` bases for a model: its native base, then the complementary ones for its head_dim."""
    head_dim = head_dim_of(config)
    return complementary_bases(rope_base(config, "attention-buckets"), head_dim, count)


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
    config = loaded.model.config
    bases = [float(b) for b in opts["bases"]] if opts["bases"] is not None else bucket_bases(config, opts["buckets"])
    head_dim = head_dim_of(config)
    schemes = [
        BucketScheme(bases, head_dim, config.num_attention_heads, config.num_key_value_heads).to(loaded.device)
        for _ in range(config.num_hidden_layers)
    ]
    return MethodParts(schemes, instances=Instances(len(bases), mix_logits))


def inspect_bases(gen, prompts: list, out: Path | None = None) -> list[str]:
    """`midlens methods attention-buckets`: the bases this model runs, and their waveforms as a PNG."""
    from midlens.generators.methods.rope_bases import plot_waveforms

    scheme = gen.parts.schemes[0]
    config = gen.loaded.model.config
    head_dim = head_dim_of(config)
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
    cost=lambda opts: len(opts["bases"]) if opts["bases"] is not None else opts["buckets"],
    defaults=DEFAULTS,
    check=check_options,
    bench_variants=BENCH_VARIANTS,
    inspect=inspect_bases,
)
