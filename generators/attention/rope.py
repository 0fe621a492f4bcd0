"""Rotary position schemes: how one attention layer turns token positions into q/k rotations.

The baseline is the model's own RoPE. The methods are parameterisations of the same rotation:
  - Ms-PoE divides positions by a per-head ratio (one expert, ratio r_h per head);
  - MoICE rotates with several bases and mixes the experts' attention per token (E experts + router);
  - MuDAF keeps RoPE and adds a trained delta to the projections (`generators.attention.delta`), no scheme of its own.
Shapes the attention module relies on: `rotate` returns q as [E, B, H, L, d] and k as [E, B, Hk, L, d],
where Hk is the number of key heads stored per expert (kv heads, or every query head when keys must be
rotated per query head); `mixing_weights` reads the PRE-RoPE query [B, H, L, d] (and the layer's hidden
states), as a trained router must, and returns [E, B, H, L, 1] or None for a single expert; `aux_loss` is a
training term the scheme accumulated during the last forward (MoICE's load balancing), or None; `key_bias` is
an additive logit bias over the keys for the queries of this forward (attn-calibration), or None; `attend`
turns rotated q, cached keys and values into the attention output (one expert here; MoICE mixes several).

Methods compose with the layer's own rotary schedule (`LayerRope`): they read the frequencies and attention
scaling the model's rotary embedding holds for the current forward (transformers recomputes them per forward for
dynamic NTK and LongRoPE, and keeps one set per layer type for Gemma 3), and change positions or bases relative
to them. A base change b -> b' multiplies channel i's frequency by (b / b')^(2i/d) (`LayerRope.rebased`), which on
a plain schedule is exactly base b' and on a scaled one keeps the model's per-channel scaling (docs/guide.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from midlens.generators.attention.arithmetic import Scoring, attend


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE on the first cos.shape[-1] channels of x: all of them, or a prefix (partial rotary, Phi-4)."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    head = x[..., :dim]
    return torch.cat((head * cos + rotate_half(head) * sin, x[..., dim:]), dim=-1)


def rotary_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, heads, L, d] for positions [B, L] and per-head frequencies [heads, d/2] or [B, heads, d/2]."""
    if inv_freq.dim() == 2:
        inv_freq = inv_freq[None]
    angles = positions[:, None, :, None].float() * inv_freq[:, :, None, :].float()
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rope_parameters(config, layer_type: str) -> dict:
    """The RoPE parameters layers of `layer_type` use: the config's own, or its entry for that type where the
    model keeps one per type (Gemma 3: {"sliding_attention": {...}, "full_attention": {...}})."""
    params = getattr(config, "rope_parameters", None) or {}
    nested = params.get(layer_type)
    return nested if isinstance(nested, dict) else params


def rebase(inv_freq: torch.Tensor, native: float, bases: list[float], plain: bool, divide: float = 1.0) -> torch.Tensor:
    """[N, d/2] frequencies of a layer whose schedule `inv_freq` [d/2] has base `native`, with the base changed to
    each of `bases` and every frequency divided by `divide` (Position Interpolation's factor).

    A plain schedule's channel i turns at b^(-2i/d); a base change b -> b' multiplies it by (b / b')^(2i/d). A scaled
    schedule (llama3, linear, YaRN, LongRoPE, dynamic) gets the same per-channel ratio on its own frequencies, so its
    per-channel scaling is kept. A plain schedule is computed from the new base itself, in float64 as before, so
    plain models answer bit-for-bit as they did."""
    rotary_dim = 2 * inv_freq.shape[-1]
    steps = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=inv_freq.device) / rotary_dim
    rows = [(b**-steps if plain else inv_freq.double() * (native / b) ** steps) / divide for b in bases]
    return torch.stack(rows).float()


@dataclass(frozen=True, eq=False)
class LayerRope:
    """One RoPE layer's own rotary schedule, read from the model's rotary embedding at each forward.

    transformers recomputes a dynamic-NTK or LongRoPE layer's frequencies in the rotary embedding's forward, before
    any layer runs (LongRoPE: the short or the long factors, by the forward's max position + 1 against
    original_max_position_embeddings), so a method that reads them at rotate time follows the regime of the forward
    as the baseline's tables do. `plain`: the schedule is base^(-2i/d) itself (rope_type "default")."""

    rotary_emb: nn.Module = field(repr=False)
    layer_type: str
    native_base: float
    rope_type: str
    rotary_dim: int

    @property
    def plain(self) -> bool:
        return self.rope_type == "default"

    def frequencies(self) -> tuple[torch.Tensor, float]:
        """(inv_freq [d/2], attention scaling) the layer rotates with in the current forward."""
        return rotary_frequencies(self.rotary_emb, self.layer_type)

    def rebased(self, bases: list[float], divide: float = 1.0) -> torch.Tensor:
        """`rebase` of the current frequencies: [N, d/2] for the N bases."""
        return rebase(self.frequencies()[0], self.native_base, bases, self.plain, divide)

    def scaled_bases(self, bases: list[float], reference: float) -> list[float]:
        """`bases` given for a model whose reference base is `reference`, carried to this layer's own base by their
        ratio to it (Gemma 3's local layers: 1e4 * b / 1e6); the same floats where the two bases are equal."""
        if self.native_base == reference:
            return [float(b) for b in bases]
        return [self.native_base * float(b) / reference for b in bases]


def layer_rope(model, layer: int) -> LayerRope:
    """The rotary schedule layer `layer` of `model` rotates with (the caller knows it rotates: not a NoPE layer)."""
    config = model.config
    types = getattr(config, "layer_types", None)
    layer_type = types[layer] if types else "full_attention"
    rotary_emb = model.model.rotary_emb
    params = rope_parameters(config, layer_type)
    base = params.get("rope_theta") or getattr(config, "rope_theta", None)
    if not base:
        raise ValueError(f"its config gives layer {layer} ({layer_type}) no RoPE base (rope_theta)")
    inv_freq, _ = rotary_frequencies(rotary_emb, layer_type)
    return LayerRope(rotary_emb, layer_type, float(base), params.get("rope_type", "default"), 2 * inv_freq.shape[-1])


def scaled_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`rotary_tables` times the layer's attention scaling (YaRN's, LongRoPE's), in q's dtype: the order of
    operations of transformers' rotary embeddings, so unit-ratio tables equal the model's own."""
    cos, sin = rotary_tables(positions, inv_freq)
    if scaling != 1.0:
        cos, sin = cos * scaling, sin * scaling
    return cos.to(dtype), sin.to(dtype)


class RotaryScheme(nn.Module):
    """Plain RoPE, exactly as the stock model applies it: the identity case every method extends."""

    num_experts = 1

    def __init__(self, inv_freq: torch.Tensor, num_heads: int, num_kv_heads: int, rope: LayerRope | None = None):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.clone().float(), persistent=False)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.rope = rope  # the layer's own schedule; None: `inv_freq` is a plain schedule used as it is

    def frequencies(self) -> tuple[torch.Tensor, float]:
        """(inv_freq, attention scaling) of the layer in the current forward."""
        return self.rope.frequencies() if self.rope is not None else (self.inv_freq, 1.0)

    @property
    def key_heads(self) -> int:
        return self.num_kv_heads

    def start_sequence(self, q: torch.Tensor, k: torch.Tensor, key_mask: torch.Tensor | None = None) -> None:
        """Called with pre-RoPE q [B, H, L, d] and k [B, G, L, d] when a new sequence is prefilled; `key_mask`
        [B, L] is False at the padding of a left-padded batch (None: no padding)."""

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_embeddings is not None:  # the model's own tables: bit-identical to stock
            cos, sin = position_embeddings
            cos, sin = cos[:, None], sin[:, None]
        else:
            cos, sin = rotary_tables(positions, self.inv_freq[None])
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return apply_rotary(q, cos, sin)[None], apply_rotary(k, cos, sin)[None]

    def mixing_weights(self, q: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return None

    def aux_loss(self) -> torch.Tensor | None:
        return None

    def attend(
        self,
        q_rot: torch.Tensor,  # [E, B, H, L, d]
        keys: torch.Tensor,  # [B, E, Hk, T, d]
        values: torch.Tensor,  # [B, Hk, T, d]
        weights: torch.Tensor | None,  # [E, B, H, L, 1] from `mixing_weights`
        mask: torch.Tensor | None,  # from `generators.attention.masks.score_mask`
        past: int,
        scoring: Scoring,
    ) -> torch.Tensor:
        """The attention output [B, H, L, d] of one expert (`weights` is None for a single expert)."""
        return attend(q_rot[0], keys[:, 0], values, mask, scoring)

    def key_bias(self, past: int, length: int, total: int) -> torch.Tensor | None:
        """Additive logits [1 or B, H or 1, length, total] for the queries at positions past..past+length-1, added
        to SDPA's mask (so SDPA still runs), or None for no bias."""
        return None


def rotary_frequencies(rotary_emb: nn.Module, layer_type: str) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention scaling) of a model's rotary embedding for layers of `layer_type`: one table for most
    models, one per layer type where the model keeps several (Gemma 3's local and global bases)."""
    inv_freq = getattr(rotary_emb, "inv_freq", None)
    if inv_freq is not None:
        return inv_freq, float(getattr(rotary_emb, "attention_scaling", 1.0))
    inv_freq = getattr(rotary_emb, f"{layer_type}_inv_freq", None)
    if inv_freq is None:
        raise ValueError(f"its rotary embedding ({type(rotary_emb).__name__}) has no inverse frequencies")
    return inv_freq, float(getattr(rotary_emb, f"{layer_type}_attention_scaling", 1.0))


def layer_inv_freq(model, layer: int) -> torch.Tensor:
    """The stock inverse frequencies layer `layer` of `model` rotates with (its layer type's, where types differ)."""
    types = getattr(model.config, "layer_types", None)
    return rotary_frequencies(model.model.rotary_emb, types[layer] if types else "full_attention")[0]


def baseline_schemes(model) -> list[RotaryScheme]:
    """Plain RoPE on every layer of `model` (a causal LM whose `model.rotary_emb` holds the stock frequencies)."""
    cfg = model.config
    return [
        RotaryScheme(layer_inv_freq(model, i), cfg.num_attention_heads, cfg.num_key_value_heads)
        for i in range(cfg.num_hidden_layers)
    ]
