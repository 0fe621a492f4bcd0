"""Attention evidence read inside the forward pass, without eager attention.

For a handful of scoring queries s (the last prompt token, the question's tokens, generated tokens) a
`PassageProbe` computes softmax(q_s K^T * scale + mask) from the rotated q and the cached K that the
attention module already holds, mixes experts with the scheme's weights, and keeps only each passage's
attention mass: one product with a 0/1 [keys x passages] span matrix. Cost per layer is O(S * T * d) per
head, against O(T^2 * d) for the forward; nothing of size T x T is ever built. The probe runs at every
decode step of every layer, so it is written for few, small tensor ops.
"""

from __future__ import annotations

import torch


class PassageProbe:
    """Collects, per layer, the attention mass [B, H, S, P] that scoring rows give to passage spans."""

    def __init__(self, spans: list[tuple[int, int]], num_layers: int):
        self.span_end = max((e for _, e in spans), default=0)
        # Passage mass = probs[..., :span_end] @ spans: one matmul instead of a cumsum and two gathers.
        self.spans = torch.zeros(self.span_end, len(spans))
        for p, (s, e) in enumerate(spans):
            self.spans[s:e, p] = 1.0
        self.num_layers = num_layers
        self.rows: list[int] = []  # indices, within the current forward's chunk, of the scoring queries
        self._rows = torch.zeros(0, dtype=torch.long)
        self.collected: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]

    def score_rows(self, rows: list[int]) -> None:
        self.rows = list(rows)
        self._rows = torch.tensor(self.rows, dtype=torch.long)

    def take(self) -> torch.Tensor:
        """All rows observed since the last take, as [layers, B, H, S, P]; resets the buffer."""
        out = torch.stack([torch.cat(per_layer, dim=2) for per_layer in self.collected])
        self.collected = [[] for _ in range(self.num_layers)]
        return out

    @torch.no_grad()
    def observe(
        self,
        layer: int,
        q_rot: torch.Tensor,  # [E, B, H, L, d]
        keys: torch.Tensor,  # [B, E, Hk, T, d]
        weights: torch.Tensor | None,  # [E, B, H, L, 1]
        past: int,
        mask: torch.Tensor | None,  # [B or 1, 1, L, T] bool/float, or None for plain causal
        scale: float,
    ) -> None:
        if not self.rows:
            return
        rows = self._rows.to(q_rot.device)
        experts, batch, heads, _, dim = q_rot.shape
        key_heads, total = keys.shape[2], keys.shape[3]
        # Group the query heads that share a key head instead of copying K per query head (GQA): this
        # runs at every decode step, where a copy of the whole cache per layer would dominate.
        q_sel = q_rot.index_select(3, rows).float().view(experts, batch, key_heads, -1, dim)
        k_all = keys.transpose(0, 1).float()  # [E, B, Hk, T, d]
        logits = (q_sel @ k_all.transpose(-1, -2) * scale).view(experts, batch, heads, len(self.rows), total)
        if mask is not None:
            row_mask = mask.index_select(-2, rows)  # [B, 1, S, T]
            if row_mask.dtype == torch.bool:
                logits = logits.masked_fill(~row_mask, float("-inf"))
            else:
                logits = logits + row_mask.float()
        elif past + min(self.rows) < total - 1:  # causal: hide the keys after each row (a decode row sees all)
            key_idx = torch.arange(total, device=q_rot.device)
            allowed = key_idx[None, :] <= (past + rows)[:, None]  # [S, T]
            logits = logits.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if weights is None:
            probs = probs[0]
        else:
            probs = (weights.index_select(3, rows).float() * probs).sum(0)
        mass = probs[..., : self.span_end] @ self.spans.to(probs.device)  # [B, H, S, P]
        self.collected[layer].append(mass)
