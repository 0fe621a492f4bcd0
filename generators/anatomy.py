"""What one decoder layer's attention computes, read from the stock module it replaces.

A model family is recognised by what its attention module does, never by its class name: the projections it
holds (`q_proj`/`k_proj`/`v_proj`, or Phi-3's fused `qkv_proj`), where it normalises q and k (per head as Qwen3
and Gemma 3, over the whole projection as OLMo 2), whether it rotates at all (SmolLM3's NoPE layers), how its
module's `apply_rotary_pos_emb` pairs channels (half-split as Llama, interleaved as GLM, over a prefix as Phi-4's
partial rotary), its scale (Granite's attention multiplier, Gemma's query_pre_attn_scalar), its logit soft-cap
(Gemma 2) and its sliding window. `PositionalAttention` runs what is read here; a module doing something this
file does not know is refused with what it is (`UnsupportedAttention`), before any weight is read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from midlens.generators.rope import LayerRope, apply_rotary, layer_rope, rotary_frequencies


class UnsupportedAttention(ValueError):
    """A layer does something the one attention module does not implement; the message says what."""


@dataclass(frozen=True)
class LayerAnatomy:
    fused_qkv: bool  # one qkv_proj whose output is [q | k | v]
    qk_norm: str | None  # None, "head" (over each head's d channels) or "projection" (over all heads at once)
    rotary: bool  # False: a NoPE layer (no position rotation)
    rotary_dim: int  # channels rotated (a prefix of each head; head_dim unless partial)
    interleaved: bool  # channel pairs (0,1), (2,3)... instead of (i, i + rotary_dim/2)
    window: int | None  # a query sees only keys fewer than `window` positions back
    softcap: float | None  # logits -> softcap * tanh(logits / softcap) before the mask
    scale: float
    layer_type: str  # config.layer_types' name ("full_attention", "sliding_attention"), for per-type RoPE

    def describe(self) -> str:
        parts = ["fused qkv" if self.fused_qkv else "q/k/v"]
        if self.qk_norm:
            parts.append(f"q/k norm per {self.qk_norm}")
        if not self.rotary:
            parts.append("no RoPE")
        else:
            parts.append(("interleaved " if self.interleaved else "") + f"RoPE on {self.rotary_dim} channels")
        if self.window:
            parts.append(f"window {self.window}")
        if self.softcap:
            parts.append(f"soft-cap {self.softcap:g}")
        return ", ".join(parts)


# Attributes that mean an attention this module does not compute, and why.
_REFUSED_PARTS = {
    "sinks": "attention sinks (learned per-head sink logits, gpt-oss): not implemented",
    "q_a_proj": "multi-head latent attention (low-rank q/kv, DeepSeek): not implemented",
    "kv_a_proj_with_mqa": "multi-head latent attention (low-rank q/kv, DeepSeek): not implemented",
    "attention_chunk_size": "chunked local attention (Llama 4): not implemented",
}


def _rotary_layout(attn: nn.Module, rotary_dim: int, head_dim: int) -> bool:
    """Whether the module's own `apply_rotary_pos_emb` pairs channels interleaved (True) or half-split (False):
    both candidates are run on one random vector and compared with what the module's function returns."""
    module = sys.modules.get(type(attn).__module__)
    apply = getattr(module, "apply_rotary_pos_emb", None)
    if apply is None:
        raise UnsupportedAttention(f"{type(attn).__name__}'s module has no apply_rotary_pos_emb to read its RoPE from")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 1, head_dim, generator=gen, dtype=torch.float64)
    angles = torch.rand(1, 1, rotary_dim // 2, generator=gen, dtype=torch.float64) * 3
    emb = torch.cat((angles, angles), dim=-1)
    got, _ = apply(x, x, emb.cos(), emb.sin())
    half = interleaved_to_half(rotary_dim, head_dim)
    for interleaved in (False, True):
        y = x[..., half] if interleaved else x
        rotated = apply_rotary(y, emb.cos()[:, None], emb.sin()[:, None])
        if interleaved:
            rotated = rotated[..., torch.argsort(half)]
        if torch.allclose(rotated, got, atol=1e-9):
            return interleaved
    raise UnsupportedAttention(
        f"{type(attn).__name__} rotates q and k in a layout midlens does not know (neither half-split nor interleaved "
        f"channel pairs over {rotary_dim} of {head_dim} channels)"
    )


def interleaved_to_half(rotary_dim: int, head_dim: int) -> torch.Tensor:
    """The channel order that turns interleaved pairs (0,1), (2,3)... into half-split ones (i, i + rotary_dim/2).

    Scores only read q . k, which a permutation applied to both leaves unchanged, so an interleaved layer runs the
    half-split rotation on permuted channels (values are never permuted)."""
    order = list(range(0, rotary_dim, 2)) + list(range(1, rotary_dim, 2)) + list(range(rotary_dim, head_dim))
    return torch.tensor(order)


def read_anatomy(attn: nn.Module, rotary_emb: nn.Module | None) -> LayerAnatomy:
    """What `attn` (a stock decoder layer's self_attn) computes; UnsupportedAttention names what is missing."""
    kind = type(attn).__name__
    for attr, why in _REFUSED_PARTS.items():
        if getattr(attn, attr, None) is not None or getattr(attn.config, attr, None) is not None:
            raise UnsupportedAttention(why)
    if not getattr(attn, "is_causal", True):
        raise UnsupportedAttention(f"{kind} attends bidirectionally; midlens answers with causal decoders")
    fused = hasattr(attn, "qkv_proj")
    if not fused and not all(hasattr(attn, f"{p}_proj") for p in "qkvo"):
        raise UnsupportedAttention(f"{kind} has neither q_proj/k_proj/v_proj/o_proj nor a fused qkv_proj")
    head_dim = attn.head_dim
    qk_norm = None
    if getattr(attn, "q_norm", None) is not None:
        size = attn.q_norm.weight.shape[-1] if getattr(attn.q_norm, "weight", None) is not None else head_dim
        qk_norm = "head" if size == head_dim else "projection"
    softcap = getattr(attn, "attn_logit_softcapping", None)
    layer_types = getattr(attn.config, "layer_types", None)
    layer_type = layer_types[attn.layer_idx] if layer_types else "full_attention"
    if hasattr(attn, "sliding_window"):  # set per layer from layer_types (Gemma, Qwen2/3, Ministral, SmolLM3)
        window = attn.sliding_window
    else:  # one window for every layer, read from the config at forward time (Mistral, Phi-3)
        window = getattr(attn.config, "sliding_window", None)
        if getattr(attn.config, "use_sliding_window", True) is False:
            window = None
    uses_rope = bool(getattr(attn, "use_rope", True))
    rotary_dim, interleaved = head_dim, False
    if uses_rope:
        if rotary_emb is None:
            raise UnsupportedAttention(f"{kind} has no rotary embedding; midlens runs RoPE decoders")
        try:
            inv_freq, _ = rotary_frequencies(rotary_emb, layer_type)
        except ValueError as err:
            raise UnsupportedAttention(str(err)) from None
        rotary_dim = 2 * inv_freq.shape[-1]
        interleaved = _rotary_layout(attn, rotary_dim, head_dim)
    return LayerAnatomy(
        fused_qkv=fused,
        qk_norm=qk_norm,
        rotary=uses_rope,
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        window=int(window) if window else None,
        softcap=float(softcap) if softcap else None,
        scale=float(attn.scaling),
        layer_type=layer_type,
    )


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (`model.model`, holding `layers` and `rotary_emb`)."""
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise UnsupportedAttention(f"{type(model).__name__} has no decoder stack at model.layers")
    return inner


def model_anatomy(model: nn.Module) -> list[LayerAnatomy]:
    """Every layer's anatomy, read from the stock modules (or the ones already replaced, which keep theirs)."""
    inner = decoder_of(model)
    rotary_emb = getattr(inner, "rotary_emb", None)
    out = []
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise UnsupportedAttention(f"{type(layer).__name__} has no self_attn")
        out.append(attn.anatomy if hasattr(attn, "anatomy") else read_anatomy(attn, rotary_emb))
    return out


def layer_ropes(model: nn.Module) -> list[LayerRope | None]:
    """Each layer's own rotary schedule (`generators.rope.LayerRope`), None for a NoPE layer."""
    return [layer_rope(model, i) if a.rotary else None for i, a in enumerate(model_anatomy(model))]


def shared_rope_problem(model: nn.Module) -> str | None:
    """Why a method that rescales RoPE positions (Ms-PoE, RoPE scaling) cannot run on `model`, or None.

    Such a method composes with each layer's own schedule (scaled frequencies, attention scaling, per-type bases,
    partial or interleaved rotary: `generators.rope.LayerRope`) and leaves NoPE layers as they are
    (`rope_scope`), so only a model none of whose layers rotates has nothing for it to change."""
    if not any(a.rotary for a in model_anatomy(model)):
        return "none of its layers uses RoPE (NoPE layers only), and the method changes RoPE positions"
    return None


def plain_rope_problem(model: nn.Module) -> str | None:
    """Why a method that changes RoPE bases (MoICE's experts, Attention Buckets, NTK scaling) cannot run on `model`,
    or None. A base change is defined on any schedule (`generators.rope.rebase`), so again only a model without a
    RoPE layer is refused."""
    if not any(a.rotary for a in model_anatomy(model)):
        return "none of its layers uses RoPE (NoPE layers only), and the method changes RoPE bases"
    return None


def rope_scope(model: nn.Module) -> str | None:
    """Where a RoPE method acts on `model` when not on every layer (NoPE layers are left as they are), for
    `midlens methods --model`; None when every layer rotates."""
    nope = [i for i, a in enumerate(model_anatomy(model)) if not a.rotary]
    if not nope:
        return None
    which = f"layers {index_ranges(nope)} have" if len(nope) > 1 else f"layer {nope[0]} has"
    kept = "are left as they are" if len(nope) > 1 else "is left as it is"
    return f"on the RoPE layers only: {which} no RoPE and {kept}"


def index_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    spans, start = [], indices[0]
    for a, b in zip(indices, indices[1:] + [None], strict=True):
        if b != a + 1:
            spans.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(spans)
