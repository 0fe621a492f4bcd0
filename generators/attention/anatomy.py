"""What one decoder layer's attention computes, read from the stock module it replaces.

A model family is recognised by what its attention module does, never by its class name: the projections it
holds (`q_proj`/`k_proj`/`v_proj`, or Phi-3's fused `qkv_proj`), where it normalises q and k (per head as Qwen3
and Gemma 3, over the whole projection as OLMo 2), whether it rotates at all (SmolLM3's NoPE layers), how its
module's `apply_rotary_pos_emb` pairs channels (half-split as Llama, interleaved as GLM, over a prefix as Phi-4's
partial rotary), its scale (Granite's attention multiplier, Gemma's query_pre_attn_scalar), its logit soft-cap
(what Gemma 2's forward passes to the attention function; Gemma 3's holds the field and passes none) and its
sliding window. `PositionalAttention` runs what is read here; a module doing something this file does not know is
refused with what it is (`UnsupportedAttention`), before any weight is read.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

from midlens.generators.attention.layer_trace import TRACED_INPUTS, AttentionTrace, SubmoduleCall, trace_attention
from midlens.generators.attention.rope import LayerRope, apply_rotary, layer_rope, rotary_frequencies


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
    qk_norm_after_rope: bool = False  # HunYuan: q and k are normalised after they are rotated
    norm_names: tuple[str, str] = ("q_norm", "k_norm")  # the layer's attributes holding its q and k norms
    interleaved_table: bool = False  # the model's cos/sin tables repeat each angle twice in a row (Cohere)

    def describe(self) -> str:
        parts = ["fused qkv" if self.fused_qkv else "q/k/v"]
        if self.qk_norm:
            parts.append(f"q/k norm per {self.qk_norm}" + (" after RoPE" if self.qk_norm_after_rope else ""))
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
    # an elementwise clamp in the forward, not a submodule, so the forward's trace cannot name it
    "clip_qkv": "q/k/v clipping (OLMo's clip_qkv): not implemented",
}


def _rotary_layout(attn: nn.Module, rotary_dim: int, head_dim: int) -> tuple[bool, bool]:
    """(interleaved pairs, interleaved table) of the module's own `apply_rotary_pos_emb`: whether it pairs channels
    (0,1), (2,3)... rather than (i, i + rotary_dim/2), and whether the cos/sin tables it takes repeat each angle
    twice in a row (Cohere's rotary embedding) rather than once per half (Llama's, GLM's). Every combination is run
    on one random vector and compared with what the module's function returns. A function that rotates every channel
    it is given (StableLM: the layer slices the rotated prefix itself) is given the prefix."""
    kind = type(attn).__name__
    module = sys.modules.get(type(attn).__module__)
    apply = getattr(module, "apply_rotary_pos_emb", None)
    if apply is None:
        raise UnsupportedAttention(f"{kind}'s module has no apply_rotary_pos_emb to read its RoPE from")
    with torch.device("cpu"):  # real values, also when the caller builds skeletons under torch.device("meta")
        return _match_layout(kind, apply, rotary_dim, head_dim)


def _match_layout(kind: str, apply, rotary_dim: int, head_dim: int) -> tuple[bool, bool]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 1, head_dim, generator=gen, dtype=torch.float64)
    angles = torch.rand(1, 1, rotary_dim // 2, generator=gen, dtype=torch.float64) * 3
    half = interleaved_to_half(rotary_dim, head_dim)
    for interleaved_table in (False, True):
        emb = angles.repeat_interleave(2, dim=-1) if interleaved_table else torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        got = _apply_stock(apply, x, cos, sin, rotary_dim)
        if got is None:
            continue
        if interleaved_table:  # compare in the half layout the module runs in (`interleaved_to_half`)
            table_order = interleaved_to_half(rotary_dim, rotary_dim)
            cos, sin = cos[..., table_order], sin[..., table_order]
        for interleaved in (False, True):
            y = x[..., half] if interleaved else x
            rotated = apply_rotary(y, cos[:, None], sin[:, None])
            if interleaved:
                rotated = rotated[..., torch.argsort(half)]
            if torch.allclose(rotated, got, atol=1e-9):
                return interleaved, interleaved_table
    raise UnsupportedAttention(
        f"{kind} rotates q and k in a layout midlens does not know (neither half-split nor interleaved channel pairs "
        f"over {rotary_dim} of {head_dim} channels, with its module's apply_rotary_pos_emb)"
    )


def _apply_stock(apply, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor | None:
    """The stock `apply_rotary_pos_emb(q, k, cos, sin)` on `x` as q and k: over every channel, or over the rotated
    prefix for a function that rotates all it is given; None where it cannot take such tables at all."""
    for prefix in (False, True):
        given = x[..., :rotary_dim] if prefix else x
        try:
            got = apply(given, given, cos, sin)[0]
        except (RuntimeError, TypeError, ValueError, IndexError):
            continue
        if got.shape == given.shape:
            return torch.cat((got, x[..., rotary_dim:]), dim=-1) if prefix else got
    return None


def interleaved_to_half(rotary_dim: int, head_dim: int) -> torch.Tensor:
    """The channel order that turns interleaved pairs (0,1), (2,3)... into half-split ones (i, i + rotary_dim/2).

    Scores only read q . k, which a permutation applied to both leaves unchanged, so an interleaved layer runs the
    half-split rotation on permuted channels (values are never permuted)."""
    order = list(range(0, rotary_dim, 2)) + list(range(1, rotary_dim, 2)) + list(range(rotary_dim, head_dim))
    return torch.tensor(order)


def read_anatomy(attn: nn.Module, rotary_emb: nn.Module | None) -> LayerAnatomy:
    """What `attn` (a stock decoder layer's self_attn) computes; UnsupportedAttention names what is missing.

    Nothing raised inside torch or transformers while reading escapes: it becomes a refusal naming the module. A
    reading is kept on the module (a plain attribute, no submodule): the load check and the install read the same
    stock layers, and each reading runs the layer's forward once."""
    kept = attn.__dict__.get("_midlens_anatomy")
    if kept is not None and kept[0] is rotary_emb:
        return kept[1]
    try:
        anatomy = _read_anatomy(attn, rotary_emb)
        attn.__dict__["_midlens_anatomy"] = (rotary_emb, anatomy)
        return anatomy
    except UnsupportedAttention:
        raise
    except Exception as err:  # a probe a module's forward or RoPE function does not take: refused, not a traceback
        raise UnsupportedAttention(
            f"{type(attn).__name__} could not be read ({type(err).__name__}: {err}); midlens runs only what it reads"
        ) from None


_PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"}
# What an input a forward needs from outside means, where it is known.
_OUTSIDE_INPUTS = {"shared_kv_states": "shared_kv_states (keys and values another layer computed: KV sharing)"}


def _inputs_from_outside(attn: nn.Module) -> list[str]:
    """The inputs `attn`'s forward requires beyond the ones a decoder layer's attention is given from its own
    hidden states (layer_trace.TRACED_INPUTS), named with their meaning where known."""
    import inspect

    try:
        params = inspect.signature(attn.forward).parameters.values()
    except (TypeError, ValueError):  # a forward with no readable signature: the trace will tell
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in params if p.default is p.empty and p.kind in named and p.name not in TRACED_INPUTS]
    return [_OUTSIDE_INPUTS.get(name, name) for name in required]


def _read_anatomy(attn: nn.Module, rotary_emb: nn.Module | None) -> LayerAnatomy:
    kind = type(attn).__name__
    for attr, why in _REFUSED_PARTS.items():
        if getattr(attn, attr, None) is not None or getattr(attn.config, attr, None) is not None:
            raise UnsupportedAttention(why)
    if not getattr(attn, "is_causal", True):
        raise UnsupportedAttention(f"{kind} attends bidirectionally; midlens answers with causal decoders")
    fused = hasattr(attn, "qkv_proj")
    if not fused and not all(hasattr(attn, f"{p}_proj") for p in "qkvo"):
        raise UnsupportedAttention(f"{kind} has neither q_proj/k_proj/v_proj/o_proj nor a fused qkv_proj")
    needs = _inputs_from_outside(attn)
    if needs:
        raise UnsupportedAttention(
            f"{kind}'s forward needs {', '.join(needs)}, an input the decoder computes outside this layer's attention; "
            "midlens' attention module computes a layer's attention from its own hidden states"
        )
    head_dim = attn.head_dim
    layer_type = _layer_type(attn)
    rotary_dim, interleaved, interleaved_table = head_dim, False, False
    if rotary_emb is not None:
        try:
            inv_freq, _ = rotary_frequencies(rotary_emb, layer_type)
        except ValueError as err:
            raise UnsupportedAttention(str(err)) from None
        rotary_dim = 2 * inv_freq.shape[-1]
    trace = trace_attention(attn, rotary_dim)
    # A layer rotates when its forward uses the tables, whatever it holds (EXAONE 4's and Cohere 2's global layers
    # hold them and do not); SmolLM3 says so in use_rope as well.
    uses_rope = trace.rotates and bool(getattr(attn, "use_rope", True))
    qk_norm, after_rope, names = _qk_norms(attn, trace, head_dim)
    if uses_rope:
        if rotary_emb is None:
            raise UnsupportedAttention(f"{kind} has no rotary embedding; midlens runs RoPE decoders")
        interleaved, interleaved_table = _rotary_layout(attn, rotary_dim, head_dim)
    if after_rope and interleaved:
        raise UnsupportedAttention(f"{kind} normalises q and k after an interleaved RoPE: not implemented")
    softcap = _softcap(attn, trace)
    return LayerAnatomy(
        fused_qkv=fused,
        qk_norm=qk_norm,
        rotary=uses_rope,
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        window=_window(attn, layer_type),
        softcap=float(softcap) if softcap else None,
        scale=float(attn.scaling),
        layer_type=layer_type,
        qk_norm_after_rope=after_rope,
        norm_names=names,
        interleaved_table=interleaved_table,
    )


def _softcap(attn: nn.Module, trace: AttentionTrace) -> float | None:
    """The logit soft-cap the forward passes to transformers' attention function: Gemma 3's config carries
    attn_logit_softcapping (and its module copies it) but its forward never passes it, while Gemma 2's does. Only
    a forward that computes attention itself, without such a function, is read from the attribute it holds."""
    if trace.attention_kwargs is not None:
        return trace.attention_kwargs.get("softcap")
    return getattr(attn, "attn_logit_softcapping", None)


def _layer_type(attn: nn.Module) -> str:
    """The layer's name in config.layer_types; "full_attention" for a model that lists none."""
    layer_types = getattr(attn.config, "layer_types", None)
    return layer_types[attn.layer_idx] if layer_types else "full_attention"


def _window(attn: nn.Module, layer_type: str) -> int | None:
    """The layer's sliding window: from config.layer_types where the config lists them, as transformers builds each
    layer's mask from them (EXAONE 4 sets sliding_window on every layer's module, global ones too); else the module's
    own attribute (Qwen2, Gemma) or one window for every layer from the config (Mistral, Phi-3)."""
    config = attn.config
    if getattr(config, "layer_types", None):
        window = getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
    elif hasattr(attn, "sliding_window"):
        window = attn.sliding_window
    else:
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", True) is False:
            window = None
    return int(window) if window else None


def _qk_norms(attn: nn.Module, trace: AttentionTrace, head_dim: int) -> tuple[str | None, bool, tuple[str, str]]:
    """(per "head" or "projection", after RoPE, (q norm's name, k norm's name)) of the norms the forward ran, found
    by what they were applied to rather than by their names (q_norm, query_layernorm, q_layernorm...). A submodule
    the forward ran that is neither a projection nor a q/k norm is refused: it would be skipped."""
    kind = type(attn).__name__
    num_heads = attn.config.num_attention_heads
    found: dict[str, SubmoduleCall] = {}
    for call in trace.calls:
        if call.name in _PROJECTIONS or call.name in found:
            continue
        role = _norm_role(call.name)
        if role is None:
            part = type(getattr(attn, call.name)).__name__
            raise UnsupportedAttention(
                f"{kind} applies {call.name} ({part}) inside its attention, which midlens' attention module does not"
            )
        found[role] = call
    if not found:
        return None, False, ("q_norm", "k_norm")
    if set(found) != {"q", "k"}:
        raise UnsupportedAttention(f"{kind} normalises only {'q' if 'q' in found else 'k'}: not implemented")
    q, k = found["q"], found["k"]
    if q.after_rope != k.after_rope:
        raise UnsupportedAttention(f"{kind} normalises q and k on different sides of RoPE: not implemented")
    size = q.input_shape[-1]
    if size == head_dim:
        how = "head"
    elif size == num_heads * head_dim:
        how = "projection"
    else:
        raise UnsupportedAttention(f"{kind} normalises q over {size} channels, neither a head nor the projection")
    if how == "head" and (len(q.input_shape) != 4 or q.input_shape[1] != num_heads):
        # per-head norms run on [B, H, L, d] here; one laid out [B, L, H, d] must be a plain norm over d
        norm = getattr(attn, q.name)
        if sum(p.numel() for p in norm.parameters()) > 2 * head_dim:
            raise UnsupportedAttention(f"{kind} applies per-head {q.name} weights to [B, L, H, d]: not implemented")
    if q.after_rope:
        norm = getattr(attn, q.name)
        if sum(p.numel() for p in norm.parameters()) > 2 * head_dim or how != "head":
            raise UnsupportedAttention(f"{kind} applies {q.name} after RoPE with per-head weights: not implemented")
    return how, q.after_rope, (q.name, k.name)


def _norm_role(name: str) -> str | None:
    """The role, "q" or "k", of a submodule named as a query or key norm (q_norm, query_layernorm, k_layernorm...)."""
    if "norm" not in name:
        return None
    head = name.split("_")[0]
    return {"q": "q", "query": "q", "k": "k", "key": "k"}.get(head)


def decoder_of(model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (`model.model`, holding `layers` and `rotary_emb`)."""
    inner = getattr(model, "model", None)
    if inner is None or not isinstance(getattr(inner, "layers", None), nn.ModuleList):
        raise UnsupportedAttention(f"{type(model).__name__} has no decoder stack at model.layers")
    return inner


# Layer types (transformers' names for its cache layers) the attention module runs; every other type keeps a
# recurrent or convolution state, or no keys of its own, which the module's one KV cache cannot hold.
_ATTENTION_TYPES = {"full_attention", "sliding_attention"}
_OTHER_TYPES = {
    "linear_attention": "state-space or linear-attention layers (Mamba, gated delta rule)",
    "hybrid": "attention beside a state-space mixer in one layer",
    "hybrid_sliding": "windowed attention beside a state-space mixer in one layer",
    "conv": "convolution layers",
    "chunked_attention": "chunked local attention",
    "dummy": "layers without keys and values of their own (they reuse another layer's, or have no attention)",
}


def non_attention_problem(model: nn.Module) -> str | None:
    """Why `model` mixes tokens other than by the attention this module runs, or None: a hybrid of attention with
    state-space, linear-attention or convolution layers (Falcon-H1, Jamba, Bamba, Qwen3-Next, LFM2, Granite-MoE-hybrid)
    or layers that reuse another layer's keys (Gemma 3n). Read from the layer types transformers builds its own cache
    from, then from the layers' modules (a causal convolution or a state-space decay parameter outside self_attn),
    so a hybrid whose config lists no layer types (Falcon-H1) is found too. Works on a meta-device skeleton."""
    config = model.config
    try:  # the same reading transformers' DynamicCache makes (kv sharing -> "dummy", legacy names remapped)
        from transformers.cache_utils import get_layer_types_and_kwargs

        types = list(get_layer_types_and_kwargs(config)[0])
    except Exception:
        types = list(getattr(config, "layer_types", None) or [])
    if getattr(config, "kv_sharing_modes", None) or getattr(config, "num_kv_shared_layers", 0):
        shared = [i for i, t in enumerate(types) if t == "dummy"]
        if shared:
            return (
                f"layers {index_ranges(shared)} reuse another layer's keys and values (KV sharing, Gemma 3n style): "
                "not implemented"
            )
    other = [(i, t) for i, t in enumerate(types) if t not in _ATTENTION_TYPES]
    if other:
        kinds = sorted({t for _, t in other})
        which = index_ranges([i for i, _ in other])
        named = "; ".join(f"{t!r}: {_OTHER_TYPES.get(t, 'not attention midlens runs')}" for t in kinds)
        return f"its config lists layers {which} as {named}. midlens runs attention-only decoders"
    mixers = [(i, _token_mixer(layer)) for i, layer in enumerate(decoder_of(model).layers)]
    mixers = [(i, m) for i, m in mixers if m is not None]
    if mixers:
        which = index_ranges([i for i, _ in mixers])
        return (
            f"layers {which} mix tokens outside attention too ({mixers[0][1]}: a state-space or convolution mixer). "
            "midlens runs attention-only decoders"
        )
    return None


def _token_mixer(layer: nn.Module) -> str | None:
    """'name (Class)' of a submodule of `layer`, outside its self_attn, that mixes positions: a 1-D convolution over
    time or a state-space decay (A_log), as Mamba, Mamba-2 and gated-delta-rule mixers hold; None if there is none."""
    for name, child in layer.named_children():
        if name == "self_attn":
            continue
        for sub in child.modules():
            own = {p for p, _ in sub.named_parameters(recurse=False)}
            if isinstance(sub, nn.Conv1d) or own & {"A_log", "dt_bias"}:
                return f"{name} ({type(child).__name__})"
    return None


def model_anatomy(model: nn.Module) -> list[LayerAnatomy]:
    """Every layer's anatomy, read from the stock modules (or the ones already replaced, which keep theirs)."""
    inner = decoder_of(model)
    problem = non_attention_problem(model)
    if problem is not None:
        raise UnsupportedAttention(problem)
    rotary_emb = getattr(inner, "rotary_emb", None)
    out = []
    for layer in inner.layers:
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise UnsupportedAttention(f"{type(layer).__name__} has no self_attn")
        out.append(attn.anatomy if hasattr(attn, "anatomy") else read_anatomy(attn, rotary_emb))
    return out


def layer_ropes(model: nn.Module) -> list[LayerRope | None]:
    """Each layer's own rotary schedule (`generators.attention.rope.LayerRope`), None for a NoPE layer."""
    return [layer_rope(model, i) if a.rotary else None for i, a in enumerate(model_anatomy(model))]


def shared_rope_problem(model: nn.Module) -> str | None:
    """Why a method that rescales RoPE positions (Ms-PoE, RoPE scaling) cannot run on `model`, or None.

    Such a method composes with each layer's own schedule (scaled frequencies, attention scaling, per-type bases,
    partial or interleaved rotary: `generators.attention.rope.LayerRope`) and leaves NoPE layers as they are
    (`rope_scope`), so only a model none of whose layers rotates has nothing for it to change."""
    if not any(a.rotary for a in model_anatomy(model)):
        return "none of its layers uses RoPE (NoPE layers only), and the method changes RoPE positions"
    return None


def plain_rope_problem(model: nn.Module) -> str | None:
    """Why a method that changes RoPE bases (MoICE's experts, Attention Buckets, NTK scaling) cannot run on `model`,
    or None. A base change is defined on any schedule (`generators.attention.rope.rebase`), so again only a model
    without a RoPE layer is refused."""
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
