"""Ms-PoE (Zhang et al., ICML 2024): per-head position rescaling, chosen by position awareness.

Each head of a patched layer reads positions divided by a ratio r_h in [ratio_min, ratio_max]
(paper Eq. 2: a linear ladder that includes both ends). Heads that are most position-aware at the
last prompt query (Eq. 1: share of keys with attention >= alpha / L) get the smallest ratios. The order
is computed once per prompt at prefill, from pre-RoPE q and K, and frozen for decoding.

Differences from the official code, on purpose (see METHODS.md):
  - ratios go to heads by the RANK of their score (inverse permutation), not by gathering with the
    argsort, which hands heads the wrong ratio;
  - GQA: `gqa="group"` (default) gives one ratio per kv group, groups ranked by their mean score, so
    q and k of a group share a ratio; `gqa="per_query_head"` rotates keys per query head instead
    (keys are cached expanded to every query head). Both keep q.k a function of (m - n) / r.
"""

from __future__ import annotations

from typing import Literal

import torch

from generators.attention import expand_heads
from generators.rope import RotaryScheme, apply_rotary

HeadOrder = Literal["awareness", "sequential", "fixed"]
GQAMode = Literal["group", "per_query_head"]


def ratio_ladder(n: int, ratio_min: float, ratio_max: float) -> torch.Tensor:
    """Paper Eq. 2: n ratios from ratio_min to ratio_max inclusive."""
    if n == 1:
        return torch.tensor([ratio_min])
    return torch.linspace(ratio_min, ratio_max, n)


def position_awareness(q: torch.Tensor, k: torch.Tensor, alpha: float = 3.0) -> torch.Tensor:
    """Eq. 1 per query head, from the last query row only: [B, H, L, d], [B, G, L, d] -> [B, H].

    The last query sees every key, so no mask is needed and only one row of the attention is built.
    """
    heads, length = q.shape[1], k.shape[2]
    last = q[:, :, -1:].float()  # [B, H, 1, d]
    logits = last @ expand_heads(k, heads).float().transpose(-1, -2) / q.shape[-1] ** 0.5
    probs = torch.softmax(logits, dim=-1)[:, :, 0]  # [B, H, L]
    return (probs >= alpha / length).float().mean(-1)


def ranks_descending(scores: torch.Tensor) -> torch.Tensor:
    """Rank of each entry along the last axis, 0 = highest score (the inverse permutation of argsort)."""
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    return torch.argsort(order, dim=-1)


class MsPoEScheme(RotaryScheme):
    def __init__(
        self,
        inv_freq: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        ratio_min: float = 1.2,
        ratio_max: float = 1.8,
        head_order: HeadOrder = "awareness",
        gqa: GQAMode = "group",
        alpha: float = 3.0,
        head_ranks: list[int] | None = None,
    ):
        super().__init__(inv_freq, num_heads, num_kv_heads)
        self.gqa = gqa
        self.head_order = head_order
        self.alpha = alpha
        units = num_kv_heads if gqa == "group" else num_heads
        self.register_buffer("ladder", ratio_ladder(units, ratio_min, ratio_max), persistent=False)
        if head_order == "fixed":
            self.fixed_ranks = torch.tensor(head_ranks, dtype=torch.long)
        elif head_order == "sequential":
            self.fixed_ranks = torch.arange(units)
        else:
            self.fixed_ranks = None
        self.last_scores: torch.Tensor | None = None
        self._set_ratios(self.ladder[None] if self.fixed_ranks is None else self.ladder[self.fixed_ranks][None])

    def _set_ratios(self, ratios: torch.Tensor) -> None:
        """Ratios of the current sequence per unit, [B, units], and the frequencies they give.

        Dividing positions by r is dividing the frequencies by r; the doubled [B, units, d] frequency rows
        are built once per sequence here, because `rotate` runs at every decode step of every layer.
        """
        self.ratios = ratios
        freqs = self.inv_freq / ratios[..., None]
        self._freqs = torch.cat((freqs, freqs), dim=-1)

    @property
    def key_heads(self) -> int:
        return self.num_kv_heads if self.gqa == "group" else self.num_heads

    def start_sequence(self, q: torch.Tensor, k: torch.Tensor) -> None:
        if self.fixed_ranks is not None:
            self._set_ratios(self.ladder[self.fixed_ranks][None].expand(q.shape[0], -1))
            return
        scores = position_awareness(q, k, self.alpha)  # [B, H]
        if self.gqa == "group":
            scores = scores.view(q.shape[0], self.num_kv_heads, -1).mean(-1)
        self.last_scores = scores
        self._set_ratios(self.ladder[ranks_descending(scores)])

    def head_ratios(self) -> torch.Tensor:
        """Ratio seen by each query head, [B, H]."""
        if self.gqa == "group":
            return self.ratios.repeat_interleave(self.num_heads // self.num_kv_heads, dim=-1)
        return self.ratios

    def rotate(self, q, k, positions, position_embeddings):
        angles = positions[:, None, :, None].float() * self._freqs.to(q.device)[:, :, None, :]  # [B, units, L, d]
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        if self.gqa == "per_query_head":  # every query head gets its own rotated copy of its group's keys
            return apply_rotary(q, cos, sin)[None], apply_rotary(expand_heads(k, self.num_heads), cos, sin)[None]
        # One ratio per kv group: view q as [B, G, heads per group, L, d] so the group's table broadcasts.
        b, heads, length, d = q.shape
        groups = self.num_kv_heads
        q_rot = apply_rotary(q.view(b, groups, heads // groups, length, d), cos[:, :, None], sin[:, :, None])
        return q_rot.view(b, heads, length, d)[None], apply_rotary(k, cos, sin)[None]

    def describe(self) -> dict:
        return {
            "scheme": "ms-poe",
            "ladder": [round(x, 4) for x in self.ladder.tolist()],
            "head_order": self.head_order,
            "gqa": self.gqa,
        }
