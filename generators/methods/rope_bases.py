"""RoPE bases for methods that mix several: the Attention-Buckets waveform of a base and the greedy choice of a
complementary set for one model's head_dim and native base (MoICE's experts; never the published Llama-2 set
reused for another model)."""

from __future__ import annotations

import math

import torch

from midlens.core.errors import MethodConfigError
from midlens.generators.attention.anatomy import layer_ropes
from midlens.generators.attention.rope import rope_parameters


def waveform(distances: torch.Tensor, base: float, head_dim: int) -> torch.Tensor:
    """Attention-Buckets' upper-bound waveform of one RoPE base over relative distance D:
    f_B(D) = (2 / sqrt(d)) * sum_{i < d/2} cos(D * B^(-2i/d))."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return (2 / math.sqrt(head_dim)) * torch.cos(distances.double()[:, None] * inv_freq[None]).sum(-1)


def complementary_bases(
    native: float,
    head_dim: int,
    count: int = 7,
    max_distance: int = 4096,
    span: tuple[float, float] = (1.0, 2.5),
    candidates: int = 301,
) -> list[float]:
    """The native base, then `count - 1` bases picked greedily from a geometric grid over native * span.

    Criterion (Attention Buckets): one base's waveform has troughs at distances where another's has peaks, so
    a set of bases leaves no distance badly attended. Each step adds the candidate whose waveform rises
    highest ABOVE the current set's upper envelope, on average over distances 1..max_distance:
        gain(c) = mean_D max(0, f_c(D) - max_{b in set} f_b(D)).
    The span default (1x to 2.5x native) is the ratio the published Llama-2 set covers (1e4 to 2.5e4);
    bases are rounded to 3 significant digits so the set is readable and stable, and listed native first, then
    ascending.
    """
    if count < 1:
        raise MethodConfigError(f"moice experts={count}: need at least the native base.")
    distances = torch.arange(1, max_distance + 1)
    grid = torch.logspace(math.log10(native * span[0]), math.log10(native * span[1]), candidates).tolist()
    grid = sorted({float(f"{b:.3g}") for b in grid} - {float(native)})
    waves = {b: waveform(distances, b, head_dim) for b in grid}
    chosen = [float(native)]
    envelope = waveform(distances, native, head_dim)
    while len(chosen) < count and waves:
        best = max(waves, key=lambda b: float((waves[b] - envelope).clamp(min=0).mean()))
        chosen.append(best)
        envelope = torch.maximum(envelope, waves.pop(best))
    return chosen[:1] + sorted(chosen[1:])


def plot_waveforms(
    bases: list[float], head_dim: int, path, max_distance: int = 4096, title: str = "the MoICE experts"
) -> None:
    """PNG of each base's waveform over distance, and the set's upper envelope; `title` names whose bases they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    distances = torch.arange(1, max_distance + 1)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    waves = [waveform(distances, b, head_dim) for b in bases]
    for i, (b, w) in enumerate(zip(bases, waves, strict=True)):
        ax.plot(distances, w, lw=1.6 if i == 0 else 0.7, label=f"{b:g}" + (" (native)" if i == 0 else ""))
    ax.plot(distances, torch.stack(waves).max(0).values, color="black", lw=1.0, ls="--", label="envelope")
    ax.set_xscale("log")
    ax.set_xlabel("relative distance D (tokens)")
    ax.set_ylabel("f_B(D), attention upper bound")
    ax.set_title(f"RoPE waveforms of {title} (head_dim {head_dim})")
    ax.legend(fontsize=8, ncol=2, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def head_dim_of(config) -> int:
    """The model's per-head width (the rotated dimension d): the config's own, or hidden_size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_base(config, method: str = "moice") -> float:
    """The model's reference RoPE base: its rope_theta, or its global (full-attention) layers' where each layer type
    keeps its own (Gemma 3). Bases a method chooses for it are carried to each layer's own base by their ratio to it
    (`generators.attention.rope.LayerRope.scaled_bases`); a scaled schedule keeps its scaling
    (`generators.attention.rope.rebase`)."""
    params = rope_parameters(config, "full_attention")
    base = params.get("rope_theta") or getattr(config, "rope_theta", None)
    if not base:  # per-type parameters without a full-attention type: the first type's
        nested = [v for v in params.values() if isinstance(v, dict) and v.get("rope_theta")]
        base = nested[0]["rope_theta"] if nested else None
    if not base:
        raise MethodConfigError(f"{method}: the model's config has no RoPE base (rope_theta).")
    return float(base)


def rotary_dim_of(model) -> int:
    """The channels a RoPE layer of `model` rotates (head_dim, or the prefix partial rotary turns): the d of the
    base^(-2i/d) schedule whose waveform chooses complementary bases."""
    ropes = [r for r in layer_ropes(model) if r is not None]
    return ropes[0].rotary_dim if ropes else head_dim_of(model.config)
