"""The one attention module every method runs through.

`PositionalAttention` replaces each decoder layer's `self_attn` (Llama, Qwen2, Mistral) and reuses its
q/k/v/o projections, so weights stay shared with the loaded model. Per forward it:
  1. projects q, k, v (plus an optional per-call `WeightDelta`, e.g. LoRA factors a method trained);
  2. asks its `RotaryScheme` to rotate them (baseline RoPE, Ms-PoE ratios, or several MoICE experts);
  3. stores keys in the KV cache already rotated (per expert, stacked on the head axis);
  4. folds the model's mask and the scheme's key bias, if any, into one score mask (`generators.scores`);
  5. lets the scheme attend (`RotaryScheme.attend`: one SDPA call, or MoICE's experts mixed by its router);
  6. lets an optional `PassageProbe` read attention rows of a few scoring queries from the same q, K and
     mask through the same score function, so evidence never needs eager attention or an L x L matrix.
Scheme, delta and probe are per-call parts, installed by `generators.context.method_context` and reset to
the identity (plain RoPE, no delta, no probe) afterwards: they are kept out of the module tree so the shared
weights, `state_dict()` and `parameters()` of the loaded model never change.
"""

from __future__ import annotations

import torch
from torch import nn

from midlens.generators.delta import WeightDelta
from midlens.generators.rope import RotaryScheme
from midlens.generators.scores import expand_heads, score_mask


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

        mask = score_mask(attention_mask, self.scheme.key_bias(past, length, total), length, total, q.device)
        weights = self.scheme.mixing_weights(q, hidden_states)  # routers read the pre-RoPE query
        out = self.scheme.attend(q_rot, keys, values, weights, mask, past, self.scaling)
        if self.probe is not None:
            self.probe.observe(self.layer_idx, q_rot, keys, weights, past, mask, self.scaling)

        out = out.transpose(1, 2).reshape(batch, length, -1)
        return self._project("o", self.o_proj, out), None


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
