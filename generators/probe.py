"""Attention evidence read inside the forward pass, without eager attention.

For a handful of scoring queries s (the last prompt token, the question's tokens, generated tokens) a
`PassageProbe` computes softmax(q_s K^T * scale + mask) from the rotated q, the cached K and the score mask
that the attention module already holds, through the function the module's own output is defined by
(`generators.scores`), mixes experts with the scheme's weights, and keeps only each passage's
attention mass: one product with a 0/1 [keys x passages] span matrix. Cost per layer is O(S * T * d) per
head, against O(T^2 * d) for the forward; nothing of size T x T is ever built. All of it runs in fp32,
whatever the model's dtype.

Decode steps are deferred: a step only keeps a reference to its query row (and mixing weights), and `take`
scores every stored row at once against the final keys, each under its step's own mask row. Per-step work is then a list
append instead of a handful of small kernels per layer, which is what made decoding with evidence slow
on a GPU (launch-bound), and the result is the same: row t sees exactly the keys it saw at step t.
"""

from __future__ import annotations

import torch

from midlens.generators.scores import attention_probs, mask_rows


class PassageProbe:
    """Collects, per layer, the attention mass [B, H, S, P] that scoring rows give to passage spans.

    `spans` are key-column ranges: one list for every batch row, or one list per row (a left-padded batch, where
    each row's passages sit at its own offset); rows with fewer passages get zero mass in the extra columns."""

    def __init__(
        self,
        spans: list[tuple[int, int]] | list[list[tuple[int, int]]],
        num_layers: int,
        layers: list[int] | None = None,
        answer_spans: list[list[tuple[int, int]]] | None = None,
    ):
        """`answer_spans` (one list per batch row): finer key spans, e.g. the passages' sentences, whose mass the
        decode rows (the answer's own queries) also record, read with `take_answer_spans` (citations)."""
        self.spans, self.span_end = _span_matrix(spans)
        self.answer_spans = None if answer_spans is None else _span_matrix(answer_spans)
        self.answer_collected: list[torch.Tensor] = []
        self.num_layers = num_layers
        # Layers whose rows are kept (evidence aggregates a subset; the rest cost nothing). Absent layers come
        # back as zeros from `take`, so indices stay the model's.
        self.layers = set(range(num_layers)) if layers is None else set(layers)
        self.rows: list[int] | torch.Tensor = []  # scoring queries within the current forward's chunk
        self._rows_on: torch.Tensor | None = None  # `rows` as a tensor on the model's device, made once per call
        self.collected: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.deferred: list[list[tuple]] = [[] for _ in range(num_layers)]  # decode rows: (q, weights, mask row)
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

    def take_answer_spans(self) -> torch.Tensor | None:
        """The decode rows' mass over `answer_spans` since the last take, [layers, B, H, S, N] on the CPU (layers
        the probe does not keep are zeros), or None when there is none; call after `take`."""
        if not self.answer_collected:
            return None
        out = torch.zeros(self.num_layers, *self.answer_collected[0][1].shape)
        for layer, mass in self.answer_collected:
            out[layer] = mass.cpu()
        self.answer_collected = []
        return out

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
        mask: torch.Tensor | None,  # the forward's `generators.scores.score_mask`
        scale: float,
    ) -> None:
        if not self._has_rows() or layer not in self.layers:
            return
        self.scale = scale
        experts, batch, heads, length, dim = q_rot.shape
        total = keys.shape[3]
        if length == 1 and not isinstance(self.rows, torch.Tensor) and self.rows == [0]:
            # A decode step: defer (see module doc), keeping the step's own mask row (bias included).
            zero = torch.zeros(batch, 1, dtype=torch.long, device=q_rot.device)
            allowed = mask_rows(mask, zero, past, total).detach()
            w = None if weights is None else weights.detach()
            self.deferred[layer].append((q_rot.detach(), w, allowed))
            self.final_keys[layer] = keys.detach()
            return
        with torch.no_grad():
            if self._rows_on is None or self._rows_on.device != q_rot.device:  # one copy per call, not per layer
                rows = self.rows if isinstance(self.rows, torch.Tensor) else torch.tensor(self.rows)[None]
                self._rows_on = rows.to(q_rot.device, torch.long)
            rows = self._rows_on.expand(batch, -1)  # [B, S]
            count = rows.shape[1]
            index = rows[None, :, None, :, None]
            q_sel = q_rot.gather(3, index.expand(experts, batch, heads, count, dim))
            w_sel = None if weights is None else weights.gather(3, index.expand(experts, batch, heads, count, 1))
            self.collected[layer].append(self._mass(q_sel, keys, w_sel, mask_rows(mask, rows, past, total)))

    def _probs(
        self, q_sel: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, allowed: torch.Tensor
    ) -> torch.Tensor:
        """q_sel [E, B, H, S, d] against keys [B, E, Hk, T, d] -> attention rows [B, H, S, T] (fp32).

        The experts' rows are mixed with the weights the module mixed their outputs with: sum_e p_e softmax_e
        is the attention the mixed output applied to the (shared) values."""
        probs = None
        for e in range(q_sel.shape[0]):
            p = attention_probs(q_sel[e], keys[:, e], allowed, self.scale)
            p = p if weights is None else weights[e].float() * p
            probs = p if probs is None else probs + p
        return probs

    def _mass(
        self, q_sel: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, allowed: torch.Tensor
    ) -> torch.Tensor:
        """-> passage mass [B, H, S, P] (fp32)."""
        probs = self._probs(q_sel, keys, weights, allowed)
        return probs[..., : self.span_end] @ self._span_matrix(probs.device)[:, None]

    @torch.no_grad()
    def _flush_deferred(self) -> None:
        for layer, steps in enumerate(self.deferred):
            if not steps:
                continue
            keys = self.final_keys[layer]
            q_sel = torch.cat([q for q, _, _ in steps], dim=3)  # [E, B, H, S, d]
            weights = None if steps[0][1] is None else torch.cat([w for _, w, _ in steps], dim=3)
            allowed = widened_rows([m for _, _, m in steps], keys.shape[3])
            probs = self._probs(q_sel, keys, weights, allowed)
            self.collected[layer].append(probs[..., : self.span_end] @ self._span_matrix(probs.device)[:, None])
            if self.answer_spans is not None:
                matrix, end = self.answer_spans
                self.answer_collected.append((layer, probs[..., :end] @ matrix.to(probs.device)[:, None]))
            self.deferred[layer] = []
            self.final_keys[layer] = None


def widened_rows(rows: list[torch.Tensor], total: int) -> torch.Tensor:
    """Decode steps' mask rows [B, 1|H, 1, T_t] -> one [B, 1|H, S, T] mask: the keys a step had not seen yet
    hidden, so each row is scored exactly as it was at its step."""
    additive = any(r.dtype != torch.bool for r in rows)
    heads = max(r.shape[1] for r in rows)
    first = rows[0]
    if additive:
        out = torch.full((first.shape[0], heads, len(rows), total), float("-inf"), device=first.device)
    else:
        out = torch.zeros(first.shape[0], heads, len(rows), total, dtype=torch.bool, device=first.device)
    for i, row in enumerate(rows):
        if additive and row.dtype == torch.bool:
            row = torch.zeros(row.shape, device=row.device).masked_fill(~row, float("-inf"))
        out[:, :, i : i + 1, : row.shape[-1]] = row
    return out


def _span_matrix(spans: list[tuple[int, int]] | list[list[tuple[int, int]]]) -> tuple[torch.Tensor, int]:
    """Key spans (one list for every row, or one per row) -> a 0/1 [rows, last end, spans] matrix and that end:
    mass = probs[..., :end] @ matrix, one matmul instead of a cumsum and two gathers. Rows with fewer spans get
    zero mass in the extra columns."""
    per_row = [list(r) for r in spans] if spans and isinstance(spans[0], list) else [list(spans)]
    end = max((e for row in per_row for _, e in row), default=0)
    matrix = torch.zeros(len(per_row), end, max((len(r) for r in per_row), default=0))
    for b, row in enumerate(per_row):
        for p, (s, e) in enumerate(row):
            matrix[b, s:e, p] = 1.0
    return matrix, end
