"""Attention evidence read inside the forward pass, without eager attention.

For a handful of scoring queries s (the last prompt token, the question's tokens, generated tokens) a
`PassageProbe` computes softmax(q_s K^T * scale + mask) from the rotated q and the cached K that the
attention module already holds, mixes experts with the scheme's weights, and keeps only each passage's
attention mass: one product with a 0/1 [keys x passages] span matrix. Cost per layer is O(S * T * d) per
head, against O(T^2 * d) for the forward; nothing of size T x T is ever built. All of it runs in fp32,
whatever the model's dtype.

Decode steps are deferred: a step only keeps a reference to its query row (and mixing weights), and `take`
scores every stored row at once against the final keys with a causal mask. Per-step work is then a list
append instead of a handful of small kernels per layer, which is what made decoding with evidence slow
on a GPU (launch-bound), and the result is the same: row t sees exactly the keys it saw at step t.
"""

from __future__ import annotations

import torch


class PassageProbe:
    """Collects, per layer, the attention mass [B, H, S, P] that scoring rows give to passage spans.

    `spans` are key-column ranges: one list for every batch row, or one list per row (a left-padded batch, where
    each row's passages sit at its own offset); rows with fewer passages get zero mass in the extra columns."""

    def __init__(
        self,
        spans: list[tuple[int, int]] | list[list[tuple[int, int]]],
        num_layers: int,
        layers: list[int] | None = None,
    ):
        per_row = [list(r) for r in spans] if spans and isinstance(spans[0], list) else [list(spans)]
        self.span_end = max((e for row in per_row for _, e in row), default=0)
        # Passage mass = probs[..., :span_end] @ spans: one matmul instead of a cumsum and two gathers.
        self.spans = torch.zeros(len(per_row), self.span_end, max((len(r) for r in per_row), default=0))
        for b, row in enumerate(per_row):
            for p, (s, e) in enumerate(row):
                self.spans[b, s:e, p] = 1.0
        self.num_layers = num_layers
        # Layers whose rows are kept (evidence aggregates a subset; the rest cost nothing). Absent layers come
        # back as zeros from `take`, so indices stay the model's.
        self.layers = set(range(num_layers)) if layers is None else set(layers)
        self.rows: list[int] | torch.Tensor = []  # scoring queries within the current forward's chunk
        self._rows_on: torch.Tensor | None = None  # `rows` as a tensor on the model's device, made once per call
        self.collected: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.deferred: list[list[tuple]] = [[] for _ in range(num_layers)]  # decode rows: (q, weights, allowed)
        self.final_keys: list[torch.Tensor | None] = [None] * num_layers
        self._spans_on: torch.Tensor | None = None

    def score_rows(self, rows: list[int] | torch.Tensor) -> None:
        """Chunk indices of the queries to score: a list shared by every batch row, or a [B, S] tensor per row."""
        self.rows = rows if isinstance(rows, torch.Tensor) else list(rows)
        self._rows_on = None

    def _has_rows(self) -> bool:
        return self.rows.numel() > 0 if isinstance(self.rows, torch.Tensor) else bool(self.rows)

    def take(self) -> torch.Tensor:
        """All rows observed since the last take, as [layers, B, H, S, P] on the CPU; resets the buffer.

        Layers the probe does not keep come back as zeros, so the first axis stays the model's layer index."""
        self._flush_deferred()
        per_layer = [torch.cat(rows, dim=2) if rows else None for rows in self.collected]
        present = next(t for t in per_layer if t is not None)
        self.collected = [[] for _ in range(self.num_layers)]
        return torch.stack([t if t is not None else torch.zeros_like(present) for t in per_layer]).cpu()

    def _span_matrix(self, device: torch.device) -> torch.Tensor:
        if self._spans_on is None or self._spans_on.device != device:
            self._spans_on = self.spans.to(device)
        return self._spans_on

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
        if not self._has_rows() or layer not in self.layers:
            return
        self.scale = scale
        experts, batch, heads, length, dim = q_rot.shape
        total = keys.shape[3]
        plain = mask is None or mask.dtype == torch.bool  # an additive bias (a method's) is scored at once
        if length == 1 and plain and not isinstance(self.rows, torch.Tensor) and self.rows == [0]:
            # A decode step: defer (see module doc), keeping the step's key mask, if any, for its row.
            allowed = None if mask is None else mask[..., :1, :].detach()
            w = None if weights is None else weights.detach()
            self.deferred[layer].append((q_rot.detach(), w, past, allowed))
            self.final_keys[layer] = keys.detach()
            return
        with torch.no_grad():
            if self._rows_on is None or self._rows_on.device != q_rot.device:  # one copy per call, not per layer
                rows = self.rows if isinstance(self.rows, torch.Tensor) else torch.tensor(self.rows)[None]
                self._rows_on = rows.to(q_rot.device, torch.long)
            rows = self._rows_on.expand(batch, -1)  # [B, S]
            count = rows.shape[1]
            q_sel = q_rot.gather(3, rows[None, :, None, :, None].expand(experts, batch, heads, count, dim))
            w_sel = (
                None
                if weights is None
                else weights.gather(3, rows[None, :, None, :, None].expand(experts, batch, heads, count, 1))
            )
            if mask is not None:
                full = mask.expand(batch, mask.shape[1], length, mask.shape[-1])
                row_mask = full.gather(2, rows[:, None, :, None].expand(batch, mask.shape[1], count, mask.shape[-1]))
                allowed = row_mask if row_mask.dtype == torch.bool else row_mask.float()  # [B, 1, S, T]
            else:  # causal: hide the keys after each row
                key_idx = torch.arange(total, device=q_rot.device)
                allowed = key_idx <= (past + rows)[:, None, :, None]  # [B, 1, S, T]
            self.collected[layer].append(self._mass(q_sel, keys, w_sel, allowed))

    def _mass(
        self, q_sel: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, allowed: torch.Tensor | None
    ) -> torch.Tensor:
        """q_sel [E, B, H, S, d] against keys [B, E, Hk, T, d] -> passage mass [B, H, S, P] (fp32)."""
        experts, batch, heads, rows, dim = q_sel.shape
        key_heads, total = keys.shape[2], keys.shape[3]
        # Group the query heads that share a key head instead of copying K per query head (GQA).
        q_g = q_sel.float().reshape(experts, batch, key_heads, -1, dim)
        k_all = keys.transpose(0, 1).float()  # [E, B, Hk, T, d]
        logits = (q_g @ k_all.transpose(-1, -2) * self.scale).view(experts, batch, heads, rows, total)
        if allowed is not None:
            if allowed.dtype == torch.bool:
                logits = logits.masked_fill(~allowed, float("-inf"))
            else:
                logits = logits + allowed
        probs = torch.softmax(logits, dim=-1)
        probs = probs[0] if weights is None else (weights.float() * probs).sum(0)
        spans = self._span_matrix(probs.device)  # [1 or B, span_end, P]
        return probs[..., : self.span_end] @ spans[:, None]  # [B, H, S, P]

    @torch.no_grad()
    def _flush_deferred(self) -> None:
        for layer, steps in enumerate(self.deferred):
            if not steps:
                continue
            keys = self.final_keys[layer]
            total = keys.shape[3]
            q_sel = torch.cat([q for q, _, _, _ in steps], dim=3)  # [E, B, H, S, d]
            weights = None if steps[0][1] is None else torch.cat([w for _, w, _, _ in steps], dim=3)
            positions = torch.tensor([p for _, _, p, _ in steps], device=keys.device)
            allowed = torch.arange(total, device=keys.device)[None, :] <= positions[:, None]  # [S, T]
            if any(m is not None for _, _, _, m in steps):  # padded rows: each step's own key mask, widened to T
                rows = []
                for i, (_, _, _, m) in enumerate(steps):
                    row = allowed[i].expand(keys.shape[0], 1, 1, total).clone()
                    if m is not None:
                        row[..., : m.shape[-1]] &= m
                    rows.append(row)
                allowed = torch.cat(rows, dim=2)  # [B, 1, S, T]
            self.collected[layer].append(self._mass(q_sel, keys, weights, allowed))
            self.deferred[layer] = []
            self.final_keys[layer] = None
