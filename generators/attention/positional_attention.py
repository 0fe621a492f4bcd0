"""The one attention module every method runs through.

`PositionalAttention` replaces each decoder layer's `self_attn` and reuses its projections and q/k norms, so
weights stay shared with the loaded model. What the stock layer computes is read from it once
(`generators.attention.anatomy`: fused or separate projections, q/k norms, NoPE layers, interleaved or partial RoPE,
sliding window, soft-cap, scale), so one module runs Llama, Qwen2/3, Mistral, Gemma 2/3, Phi-3, OLMo 2,
SmolLM3, Granite and GLM-4 layers. Per forward it:
  1. projects q, k, v (plus an optional per-call `WeightDelta`, e.g. LoRA factors a method trained) and
     normalises q and k where the layer does;
  2. asks its `RotaryScheme` to rotate them (baseline RoPE, Ms-PoE ratios, or several MoICE experts); a NoPE
     layer does not rotate, and an interleaved layer's channels are permuted to the half-split pairs first;
  3. stores keys in the KV cache already rotated (per expert, stacked on the head axis);
  4. folds the model's mask, the layer's sliding window and the scheme's key bias, if any, into one score mask
     (`generators.attention.masks.score_mask`), under which the layer's `Scoring` (scale, soft-cap,
     `generators.attention.arithmetic`) is applied;
  5. lets the scheme attend (`RotaryScheme.attend`: one SDPA call, or MoICE's experts mixed by its router);
  6. lets an optional `PassageProbe` read attention rows of a few scoring queries from the same q, K and
     mask through the same score function, so evidence never needs eager attention or an L x L matrix.
Scheme, delta and probe are per-call parts, installed by `generators.methods.install.method_context` and reset to
the identity (plain RoPE, no delta, no probe) afterwards: they are kept out of the module tree so the shared
weights, `state_dict()` and `parameters()` of the loaded model never change.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from midlens.generators.attention.anatomy import LayerAnatomy, decoder_of, interleaved_to_half, read_anatomy
from midlens.generators.attention.arithmetic import Scoring, expand_heads
from midlens.generators.attention.delta import WeightDelta
from midlens.generators.attention.masks import score_mask
from midlens.generators.attention.rope import RotaryScheme, layer_inv_freq


class PositionalAttention(nn.Module):
    def __init__(self, original: nn.Module, scheme: RotaryScheme, anatomy: LayerAnatomy):
        super().__init__()
        config = original.config
        self.config = config
        self.anatomy = anatomy
        self.layer_idx = original.layer_idx
        self.head_dim = original.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = original.scaling
        self.scoring = Scoring(anatomy.scale, anatomy.softcap)
        self.is_causal = True
        if anatomy.fused_qkv:
            self.qkv_proj = original.qkv_proj
        else:
            self.q_proj, self.k_proj, self.v_proj = original.q_proj, original.k_proj, original.v_proj
        self.o_proj = original.o_proj
        # held as q_norm / k_norm whatever the stock layer names them (HunYuan: query_layernorm / key_layernorm)
        q_name, k_name = anatomy.norm_names
        self.q_norm = getattr(original, q_name, None) if anatomy.qk_norm else None
        self.k_norm = getattr(original, k_name, None) if anatomy.qk_norm else None
        order = interleaved_to_half(anatomy.rotary_dim, self.head_dim) if anatomy.interleaved else None
        self.register_buffer("channel_order", order, persistent=False)
        # Cohere's tables repeat each angle twice in a row; the module rotates half-split pairs, so they are reordered
        table = interleaved_to_half(anatomy.rotary_dim, anatomy.rotary_dim) if anatomy.interleaved_table else None
        self.register_buffer("table_order", table, persistent=False)
        self.base_scheme = scheme  # plain RoPE: what the layer runs when no method is installed
        self.use()

    def use(self, scheme: RotaryScheme | None = None, delta: WeightDelta | None = None, probe=None) -> None:
        """Install per-call parts (None = identity). Plain attributes, not submodules: see the module doc."""
        self.__dict__["scheme"] = scheme if scheme is not None else self.base_scheme
        self.__dict__["delta"] = delta
        self.__dict__["probe"] = probe  # a PassageProbe while evidence is being read

    def _project(self, name: str, linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        return self._add_delta(name, linear(x), x)

    def _qkv(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, L, d], k and v [B, G, L, d] as the stock layer makes them, before RoPE."""
        batch, length, _ = hidden_states.shape
        if self.anatomy.fused_qkv:  # [q | k | v]; a delta still adds to each part by its name
            fused = self.qkv_proj(hidden_states)
            sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim)
            q, k, v = fused.split([sizes[0], sizes[1], sizes[1]], dim=-1)
            q, k, v = (self._add_delta(n, t, hidden_states) for n, t in zip("qkv", (q, k, v), strict=True))
        else:
            q, k, v = (self._project(n, getattr(self, f"{n}_proj"), hidden_states) for n in "qkv")
        if self.anatomy.qk_norm == "projection":  # OLMo 2: one norm over all heads' channels
            q, k = self.q_norm(q), self.k_norm(k)
        shape = (batch, length, -1, self.head_dim)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if self.anatomy.qk_norm == "head" and not self.anatomy.qk_norm_after_rope:  # Qwen3, Gemma 3, StableLM
            q, k = self.q_norm(q), self.k_norm(k)
        if self.channel_order is not None:
            q, k = q[..., self.channel_order], k[..., self.channel_order]
        return q, k, v

    def _add_delta(self, name: str, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
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
        q, k, v = self._qkv(hidden_states)

        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        if past == 0:
            # The keys the last query (a real token in every left-padded row) sees: the batch's padding and the
            # layer's window both hidden. The window is applied here, not read from the mask, because a prompt
            # alone may come with no mask at all, and Ms-PoE must rank a row's heads alike alone and in a batch.
            seen = score_mask(attention_mask, None, length, length, q.device, self.anatomy.window)
            key_mask = seen[:, 0, -1] if seen is not None else None
            if key_mask is not None and key_mask.dtype != torch.bool:
                key_mask = key_mask > float("-inf")
            self.scheme.start_sequence(q, k, key_mask)
        if position_ids is None:
            position_ids = torch.arange(past, past + length, device=q.device)[None].expand(batch, -1)

        if self.anatomy.rotary:
            if position_embeddings is not None and self.table_order is not None:
                position_embeddings = tuple(t[..., self.table_order] for t in position_embeddings)
            q_rot, k_rot = self.scheme.rotate(q, k, position_ids, position_embeddings)
            # OLMo 2 hands float32 tables to a bf16 layer and rotates in float32, then returns to the layer's dtype
            q_rot, k_rot = q_rot.to(q.dtype), k_rot.to(k.dtype)
        else:  # a NoPE layer (SmolLM3's, EXAONE 4's and Cohere 2's global layers) does not rotate
            q_rot, k_rot = q[None], k[None]
        if self.anatomy.qk_norm_after_rope:  # HunYuan: over each rotated head's channels, every expert alike
            q_rot, k_rot = self.q_norm(q_rot), self.k_norm(k_rot)
        experts, key_heads = k_rot.shape[0], k_rot.shape[2]
        keys = k_rot.transpose(0, 1).reshape(batch, experts * key_heads, length, self.head_dim)
        if past_key_values is not None:
            keys, v = past_key_values.update(keys, v, self.layer_idx)
        total = keys.shape[2]
        keys = keys.view(batch, experts, key_heads, total, self.head_dim)
        values = expand_heads(v, key_heads)

        key_bias = self.scheme.key_bias(past, length, total)
        mask = score_mask(attention_mask, key_bias, length, total, q.device, self.anatomy.window)
        weights = self.scheme.mixing_weights(q, hidden_states)  # routers read the pre-RoPE query
        out = self.scheme.attend(q_rot, keys, values, weights, mask, past, self.scoring)
        if self.probe is not None:
            self.probe.observe(self.layer_idx, q_rot, keys, weights, past, mask, self.scoring)

        out = out.transpose(1, 2).reshape(batch, length, -1)
        return self._project("o", self.o_proj, out), None


def new_cache() -> DynamicCache:
    """A KV cache that keeps every key of every layer. transformers' cache for a model with sliding windows drops
    keys a window has passed, which would shift the key columns passage spans and masks are laid out in; here the
    window lives in the score mask instead (`generators.attention.masks.score_mask`), so a hidden key gets zero
    attention, and zero evidence, from that layer's later queries rather than vanishing."""
    return DynamicCache()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return decoder_of(model).layers


def install_positional_attention(model: nn.Module) -> list[PositionalAttention]:
    """Swap every layer's attention for `PositionalAttention` with baseline RoPE (idempotent)."""
    modules = []
    rotary_emb = getattr(decoder_of(model), "rotary_emb", None)
    for i, layer in enumerate(decoder_layers(model)):
        attn = layer.self_attn
        if not isinstance(attn, PositionalAttention):
            cfg = attn.config
            anatomy = read_anatomy(attn, rotary_emb)
            if anatomy.rotary:
                inv_freq = layer_inv_freq(model, i)
            else:  # a NoPE layer never rotates; its scheme only attends
                inv_freq = torch.zeros(attn.head_dim // 2, device=attn.o_proj.weight.device)
            scheme = RotaryScheme(inv_freq, cfg.num_attention_heads, cfg.num_key_value_heads)
            attn = PositionalAttention(attn, scheme, anatomy)
            layer.self_attn = attn
        modules.append(attn)
    return modules
