"""The one attention module every method runs through.

`PositionalAttention` replaces each decoder layer's `self_attn` (Llama, Qwen2, Mistral) and reuses its
q/k/v/o projections, so weights stay shared with the loaded model. Per forward it:
  1. projects q, k, v (plus an optional per-call `WeightDelta`, e.g. LoRA factors a method trained);
  2. asks its `RotaryScheme` to rotate them (baseline RoPE, Ms-PoE ratios, or several MoICE experts);
  3. stores keys in the KV cache already rotated (per expert, stacked on the head axis);
  4. runs SDPA once per expert that any token was routed to and mixes the outputs with the scheme's weights
     (one expert: no mixing);
  5. adds the scheme's key bias, if any, to SDPA's mask (attn-calibration reweights passages this way);
  6. lets an optional `PassageProbe` read attention rows of a few scoring queries, computed from the
     q and K in hand (and the same mask), so evidence never needs eager attention or an L x L matrix.
Scheme, delta and probe are per-call parts, installed by `generators.context.method_context` and reset to
the identity (plain RoPE, no delta, no probe) afterwards: they are kept out of the module tree so the shared
weights, `state_dict()` and `parameters()` of the loaded model never change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from midlens.generators.delta import WeightDelta
from midlens.generators.rope import RotaryScheme


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, T, d] -> [..., heads, T, d], repeating each kv head for its query heads (GQA)."""
    groups = x.shape[-3]
    return x if groups == heads else x.repeat_interleave(heads // groups, dim=-3)


class PositionalAttention(nn.Module):
    def __init__(self, original: nn.Module, scheme: RotaryScheme):
        super().__init__()
        config = original.config
        self.config = config
        self.layer_idx = original.layer_idx
        self.head_dim = original.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = original.scaling
        self.is_causal = True
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            original.q_proj,
            original.k_proj,
            original.v_proj,
            original.o_proj,
        )
        self.base_scheme = scheme  # plain RoPE: what the layer runs when no method is installed
        self.use()

    def use(self, scheme: RotaryScheme | None = None, delta: WeightDelta | None = None, probe=None) -> None:
        """Install per-call parts (None = identity). Plain attributes, not submodules: see the module doc."""
        self.__dict__["scheme"] = scheme if scheme is not None else self.base_scheme
        self.__dict__["delta"] = delta
        self.__dict__["probe"] = probe  # a PassageProbe while evidence is being read

    def _project(self, name: str, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        out = linear(x)
        if self.delta is not None:
            extra = self.delta.project(self.layer_idx, name, x)
            if extra is not None:
                out = out + extra.to(out.dtype)
        return out

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        position_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, None]:
        batch, length, _ = hidden_states.shape
        shape = (batch, length, -1, self.head_dim)
        q = self._project("q", self.q_proj, hidden_states).view(shape).transpose(1, 2)
        k = self._project("k", self.k_proj, hidden_states).view(shape).transpose(1, 2)
        v = self._project("v", self.v_proj, hidden_states).view(shape).transpose(1, 2)

        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        if past == 0:  # a left-padded batch's last row (a real token in every row) says which keys are real
            key_mask = attention_mask[:, 0, -1, :length] if attention_mask is not None else None
            if key_mask is not None and key_mask.dtype != torch.bool:
                key_mask = key_mask > float("-inf")
            self.scheme.start_sequence(q, k, key_mask)
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=q.device)[None].expand(batch, -1)

        q_rot, k_rot = self.scheme.rotate(q, k, position_ids, position_embeddings)
        experts, key_heads = k_rot.shape[0], k_rot.shape[2]
        keys = k_rot.transpose(0, 1).reshape(batch, experts * key_heads, length, self.head_dim)
        if past_key_values is not None:
            keys, v = past_key_values.update(keys, v, self.layer_idx)
        total = keys.shape[2]
        keys = keys.view(batch, experts, key_heads, total, self.head_dim)
        values = expand_heads(v, key_heads)

        mask = attention_mask
        if mask is not None and mask.shape[-1] != total:
            mask = mask[..., :total]
        if mask is None and 1 < length < total:  # a chunk after a cached prefix: causal with an offset
            mask = torch.ones(length, total, dtype=torch.bool, device=q.device).tril(total - length)
        bias = self.scheme.key_bias(past, length, total)
        if bias is not None:
            mask = additive_mask(mask, length, total, q.device) + bias.to(q.device)
            mask = mask.to(q.dtype)
        is_causal = mask is None and length > 1

        weights = self.scheme.mixing_weights(q, hidden_states)  # routers read the pre-RoPE query
        # An expert no token or head was routed to is skipped (one host sync per layer, not one per expert).
        active = [True] * experts if weights is None else weights.flatten(1).ne(0).any(1).tolist()
        out = None
        for e in range(experts):
            if not active[e]:
                continue
            o = None
            if weights is not None and length > 1:
                o = routed_attention(q_rot[e], keys[:, e], values, weights[e], mask, past, self.scaling)
            if o is None:
                o = F.scaled_dot_product_attention(
                    q_rot[e],
                    keys[:, e],
                    values,
                    attn_mask=mask,
                    is_causal=is_causal,
                    scale=self.scaling,
                    enable_gqa=key_heads != self.num_heads,
                )
                o = o if weights is None else weights[e] * o
            out = o if out is None else out + o

        if self.probe is not None:
            self.probe.observe(self.layer_idx, q_rot, keys, weights, past, mask, self.scaling)

        out = out.transpose(1, 2).reshape(batch, length, -1)
        return self._project("o", self.o_proj, out), None


ROUTED_SHARE = 0.75  # an expert runs on its routed queries only when no head routes more than this share to it


def routed_attention(
    q: torch.Tensor,  # [B, H, L, d], rotated for this expert
    keys: torch.Tensor,  # [B, Hk, T, d]
    values: torch.Tensor,  # [B, Hk, T, d]
    weight: torch.Tensor,  # [B, H, L, 1], zero where a query was not routed to this expert
    mask: torch.Tensor | None,  # [B or 1, 1 or H, L, T] or None for causal
    past: int,
    scale: float,
) -> torch.Tensor | None:
    """weight * attention of one expert, computed for the queries routed to it only (top-K of N routing leaves
    each expert ~K/N of them); None when that would not be cheaper than running every query.

    Per (batch, head) the routed queries are gathered in prompt order and padded to the longest list with
    unrouted ones, whose weight is 0; each gathered row keeps its own causal mask, so SDPA still runs and the
    result, scattered back, equals the dense computation row for row."""
    chosen = weight[..., 0] != 0  # [B, H, L]
    length, total, dim = q.shape[2], keys.shape[2], q.shape[3]
    rows = int(chosen.sum(-1).max())
    if rows > ROUTED_SHARE * length:
        return None
    order = torch.sort(chosen.to(torch.int8), dim=-1, descending=True, stable=True).indices[..., :rows]  # [B, H, m]
    q_sel = q.gather(2, order[..., None].expand(-1, -1, -1, dim))
    if mask is None:
        allowed = torch.arange(total, device=q.device) <= (past + order)[..., None]  # [B, H, m, T]
    else:
        full = mask.expand(order.shape[0], order.shape[1], length, total)
        allowed = full.gather(2, order[..., None].expand(-1, -1, -1, total))
    o = F.scaled_dot_product_attention(
        q_sel, keys, values, attn_mask=allowed, scale=scale, enable_gqa=keys.shape[1] != q.shape[1]
    )
    o = o * weight.gather(2, order[..., None])
    return torch.zeros_like(q).scatter_add(2, order[..., None].expand(-1, -1, -1, dim), o.to(q.dtype))


def additive_mask(mask: torch.Tensor | None, length: int, total: int, device: torch.device) -> torch.Tensor:
    """The attention mask as additive fp32 logits (0 allowed, -inf hidden), causal when no mask was given."""
    if mask is None:
        if length == 1:
            return torch.zeros(1, 1, 1, total, device=device)
        mask = torch.ones(length, total, dtype=torch.bool, device=device).tril(total - length)
    if mask.dtype != torch.bool:
        return mask.float()
    return torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


def install_positional_attention(model: nn.Module) -> list[PositionalAttention]:
    """Swap every layer's attention for `PositionalAttention` with baseline RoPE (idempotent)."""
    modules = []
    inv_freq = model.model.rotary_emb.inv_freq
    for layer in decoder_layers(model):
        attn = layer.self_attn
        if not isinstance(attn, PositionalAttention):
            cfg = attn.config
            attn = PositionalAttention(attn, RotaryScheme(inv_freq, cfg.num_attention_heads, cfg.num_key_value_heads))
            layer.self_attn = attn
        modules.append(attn)
    return modules
