"""Attention evidence read inside the forward pass, without eager attention.

For a handful of scoring queries s (the last prompt token, the question's tokens, generated tokens) a
`PassageProbe` computes softmax(q_s K^T * scale + mask) from the rotated q, the cached K and the score mask
that the attention module already holds, through the function the module's own output is defined by
(`generators.attention.arithmetic`), mixes experts with the scheme's weights, and keeps only each passage's
attention mass: one product with a 0/1 [keys x passages] span matrix. Cost per layer is O(S * T * d) per
head, against O(T^2 * d) for the forward; nothing of size T x T is ever built. All of it runs in fp32,
whatever the model's dtype.

Nothing is scored inside the forward. `observe` keeps each layer's selected query rows (and mixing weights), the
rows of its score mask and a reference to its keys; `take` scores every stored row at once against the final
keys, each under its own mask row, several layers per batched product. Inside the forward, a dozen small kernels
per kept layer (and a host copy that synchronised the stream) ran between the model's own layers and made a
GPU prefill launch-bound: +40 % over the stock model at 2k and 8k tokens (H200, bf16, Qwen's shape). Deferred,
they are launched after the whole forward is queued. The result is the same: a row sees exactly the keys it saw
when it was observed (a decode step's row hides the keys that came later).
"""

from __future__ import annotations

import numpy as np
import torch

from midlens.core.device import id_tensor, to_device_async
from midlens.generators.attention.arithmetic import Scoring, attention_probs
from midlens.generators.attention.masks import mask_rows, widened_rows


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
        self.spans = _Spans(spans)
        self.answer_spans = None if answer_spans is None else _Spans(answer_spans)
        self.answer_collected: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.num_layers = num_layers
        # Layers whose rows are kept (evidence aggregates a subset; the rest cost nothing). Absent layers come
        # back as zeros from `take`, so indices stay the model's.
        self.layers = set(range(num_layers)) if layers is None else set(layers)
        self.rows: list[int] | torch.Tensor = []  # scoring queries within the current forward's chunk
        self._rows_on: torch.Tensor | None = None  # `rows` [B, S] on the model's device, made once per call
        self._index_on: torch.Tensor | None = None  # shared `rows` as one index vector on the model's device
        self._decode = False  # `rows` is [0]: a decode step's one query
        self._any_rows = False
        self._answer_chunk = False  # the scored rows are answer tokens fed as one chunk (a given answer)
        self.collected: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]
        self.deferred: list[list[_Pending]] = [[] for _ in range(num_layers)]  # observed, not yet scored
        self.final_keys: list[torch.Tensor | None] = [None] * num_layers
        self._mask_cache: tuple | None = None  # (key, what it holds alive, mask rows) of the last forward
        self._zero: torch.Tensor | None = None  # a decode step's one row index per batch row

    def score_rows(self, rows: list[int] | torch.Tensor, answer: bool = False) -> None:
        """Chunk indices of the queries to score: a list shared by every batch row, or a [B, S] tensor per row.
        `answer`: they are an answer's own queries fed in one chunk (teacher-forced), recorded over `answer_spans`
        as decode steps' are."""
        self._answer_chunk = answer
        self.rows = rows if isinstance(rows, torch.Tensor) else list(rows)
        self._rows_on = self._index_on = None
        self._decode = self.rows == [0] if isinstance(self.rows, list) else False
        self._any_rows = self.rows.numel() > 0 if isinstance(self.rows, torch.Tensor) else bool(self.rows)

    def take(self) -> torch.Tensor:
        """All rows observed since the last take, as [layers, B, H, S, P] on the CPU; resets the buffer.

        Layers the probe does not keep come back as zeros, so the first axis stays the model's layer index."""
        self._flush_deferred()
        out = _to_host(self.collected, self.num_layers)
        self.collected = [[] for _ in range(self.num_layers)]
        if out is None:
            raise RuntimeError("PassageProbe.take(): no scoring row was observed since the last take")
        return out

    def take_answer_spans(self) -> torch.Tensor | None:
        """The decode rows' mass over `answer_spans` since the last take, [layers, B, H, S, N] on the CPU (layers
        the probe does not keep are zeros), or None when there is none; call after `take`."""
        out = self.answer_spans_so_far()
        self.answer_collected = [[] for _ in range(self.num_layers)]
        return out

    def answer_spans_so_far(self) -> torch.Tensor | None:
        """`take_answer_spans` without resetting, the decode rows observed so far scored first: a streamed
        answer reads each sentence's rows when the sentence ends, and the rows stay for the final take."""
        self._flush_deferred()
        return _to_host(self.answer_collected, self.num_layers)

    def _device_rows(self, batch: int, device: torch.device) -> torch.Tensor:
        """`rows` as a [B, S] long tensor on `device`: copied once per call without waiting for the stream, and
        the same tensor for every layer (the mask rows computed from it are shared by that identity)."""
        if self._rows_on is None or self._rows_on.device != device or self._rows_on.shape[0] != batch:
            if isinstance(self.rows, torch.Tensor):
                self._rows_on = to_device_async(self.rows.long(), device)
            else:
                self._rows_on = self._device_index(device)[None]
            self._rows_on = self._rows_on.expand(batch, -1)
        return self._rows_on

    def _device_index(self, device: torch.device) -> torch.Tensor:
        """Shared `rows` as one long vector on `device`, copied once per call."""
        if self._index_on is None or self._index_on.device != device:
            self._index_on = to_device_async(id_tensor(self.rows), device)
        return self._index_on

    def _mask_rows(
        self, mask: torch.Tensor | None, rows: torch.Tensor, decode: bool, past: int, total: int
    ) -> torch.Tensor:
        """`mask_rows` of this forward, computed once for every layer that sees the same mask (the model hands
        each layer the same one unless a method adds a per-layer bias). The mask is held with its result, so
        its storage cannot be reused by another tensor while its address is the key."""
        key = (
            None if mask is None else (mask.data_ptr(), tuple(mask.shape), mask.stride(), mask.dtype),
            decode,
            id(rows),
            past,
            total,
        )
        if self._mask_cache is not None and self._mask_cache[0] == key:
            return self._mask_cache[2]
        allowed = mask_rows(mask, rows, past, total).detach()
        self._mask_cache = (key, (mask, rows), allowed)
        return allowed

    def observe(
        self,
        layer: int,
        q_rot: torch.Tensor,  # [E, B, H, L, d]
        keys: torch.Tensor,  # [B, E, Hk, T, d]
        weights: torch.Tensor | None,  # [E, B, H, L, 1]
        past: int,
        mask: torch.Tensor | None,  # the forward's `generators.attention.masks.score_mask`
        scoring: Scoring,
    ) -> None:
        # Runs between the model's layers, where every microsecond of host time delays the next layer's launches
        # (a GPU prefill of a small model is host-bound): one index kernel per tensor, nothing else.
        if not self._any_rows or layer not in self.layers:
            return
        self.scoring = scoring
        experts, batch, heads, length, dim = q_rot.shape
        decode = length == 1 and self._decode
        if decode:  # a decode step: its one query row, whose answer-span mass citations read too
            q_sel, w_sel = q_rot, weights
            rows = self._decode_row(batch, q_rot.device)
        elif isinstance(self.rows, list):  # the same rows in every batch row
            index = self._device_index(q_rot.device)
            q_sel = q_rot.index_select(3, index)
            w_sel = None if weights is None else weights.index_select(3, index)
            rows = self._device_rows(batch, q_rot.device)
        else:
            rows = self._device_rows(batch, q_rot.device)  # [B, S]
            index = rows[None, :, None, :, None]
            count = rows.shape[1]
            q_sel = q_rot.gather(3, index.expand(experts, batch, heads, count, dim))
            w_sel = None if weights is None else weights.gather(3, index.expand(experts, batch, heads, count, 1))
        allowed = self._mask_rows(mask, rows, decode, past, keys.shape[3])
        # The probe only reads: in a training step's forward (a delta's q or k, MoICE's routers) it holds no graph.
        answer = decode or self._answer_chunk
        self.deferred[layer].append(_Pending(_detached(q_sel), _detached(w_sel), allowed, answer))
        self.final_keys[layer] = _detached(keys)

    def _decode_row(self, batch: int, device: torch.device) -> torch.Tensor:
        if self._zero is None or self._zero.shape[0] != batch or self._zero.device != device:
            self._zero = torch.zeros(batch, 1, dtype=torch.long, device=device)
        return self._zero

    def _probs(
        self, q_sel: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor | None, allowed: torch.Tensor
    ) -> torch.Tensor:
        """q_sel [E, B, H, S, d] against keys [B, E, Hk, T, d] -> attention rows [B, H, S, T] (fp32).

        The experts' rows are mixed with the weights the module mixed their outputs with: sum_e p_e softmax_e
        is the attention the mixed output applied to the (shared) values."""
        probs = None
        for e in range(q_sel.shape[0]):
            p = attention_probs(q_sel[e], keys[:, e], allowed, self.scoring)
            p = p if weights is None else weights[e].float() * p
            probs = p if probs is None else probs + p
        return probs

    @torch.no_grad()
    def _flush_deferred(self) -> None:
        """Score every deferred row: each layer's rows merged, then layers that share shapes and mask rows
        scored together, as many per block as `BLOCK_BYTES` allows."""
        merged: dict[int, _Merged] = {}
        widened: dict[tuple, tuple] = {}  # decode masks widen alike on every layer: once per set of rows
        for layer, pending in enumerate(self.deferred):
            if pending:
                merged[layer] = _merge(pending, self.final_keys[layer], widened)
            self.deferred[layer] = []
            self.final_keys[layer] = None
        self._mask_cache = None
        groups: dict[tuple, list[int]] = {}
        for layer, m in merged.items():
            groups.setdefault(m.signature(), []).append(layer)
        for layers in groups.values():
            first = merged[layers[0]]
            per_layer = max(1, first.bytes_to_score())
            size = max(1, BLOCK_BYTES // per_layer)
            for start in range(0, len(layers), size):
                block = [merged[layer] for layer in layers[start : start + size]]
                probs = self._block_probs(block)  # [G, B, H, S, T]
                mass = self._span_mass(probs, self.spans)
                for i, layer in enumerate(layers[start : start + size]):
                    self.collected[layer].append(mass[i])
                    if self.answer_spans is not None and block[i].answer_rows:
                        answer = probs[i][:, :, block[i].answer_rows]
                        self.answer_collected[layer].append(self._span_mass(answer[None], self.answer_spans)[0])

    def _block_probs(self, block: list[_Merged]) -> torch.Tensor:
        """Attention rows of a block of layers that share shapes and mask rows -> [G, B, H, S, T] (fp32): the
        layers stacked on the batch axis of one `_probs` call."""
        first = block[0]
        experts, batch, heads, rows, dim = first.q.shape
        q = torch.stack([m.q for m in block], dim=1).reshape(experts, -1, heads, rows, dim)
        keys = torch.stack([m.keys for m in block]).flatten(0, 1)  # [G*B, E, Hk, T, d]
        weights = None if first.weights is None else torch.stack([m.weights for m in block], dim=1).flatten(1, 2)
        allowed = first.allowed
        if allowed.shape[0] > 1:  # per-row masks repeat for every layer of the block
            allowed = allowed.repeat(len(block), 1, 1, 1)
        probs = self._probs(q, keys, weights, allowed)
        return probs.view(len(block), batch, *probs.shape[1:])

    def _span_mass(self, probs: torch.Tensor, spans: _Spans) -> torch.Tensor:
        """probs [G, B, H, S, T] -> mass per span [G, B, H, S, N]: one product with the 0/1 span matrix. With
        one span list for every row, the rows of all layers, heads and queries form one 2-D product (a batched
        one per head ran a slow small-N kernel on the GPU)."""
        matrix, end = spans.on(probs.device), spans.end
        g, b, h, s, total = probs.shape
        if matrix.shape[0] == 1:
            flat = probs.reshape(-1, total)[:, :end] @ matrix[0]
            return flat.view(g, b, h, s, -1)
        out = probs.reshape(g, b, h * s, total)[..., :end] @ matrix[None]
        return out.view(g, b, h, s, -1)


# fp32 bytes one block of layers may hold while it is scored (logits, probabilities and keys): the long-prompt
# memory stays within a few percent of the prefill's, and a short prompt's kept layers fit in one block.
BLOCK_BYTES = 128 * 2**20


class _Pending:
    """One observed forward of one layer: its selected query rows, mixing weights and mask rows."""

    __slots__ = ("allowed", "decode", "q", "weights")

    def __init__(self, q: torch.Tensor, weights: torch.Tensor | None, allowed: torch.Tensor, decode: bool):
        self.q, self.weights, self.allowed, self.decode = q, weights, allowed, decode


class _Merged:
    """A layer's deferred rows as one block: q [E, B, H, S, d], its final keys, mask rows [B', H', S, T]
    and which of the S rows were decode steps (the answer's own queries)."""

    def __init__(self, q, weights, allowed, keys, answer_rows):
        self.q, self.weights, self.allowed, self.keys, self.answer_rows = q, weights, allowed, keys, answer_rows

    def signature(self) -> tuple:
        return (tuple(self.q.shape), tuple(self.keys.shape), self.weights is None, id(self.allowed))

    def bytes_to_score(self) -> int:
        """fp32 bytes of scoring this layer: its logits and probabilities (`attention_probs` scales and masks in
        place) and its keys in fp32."""
        experts, batch, heads, rows, dim = self.q.shape
        total = self.keys.shape[3]
        return 4 * (2 * batch * heads * rows * total + self.keys.numel())


def _merge(pending: list[_Pending], keys: torch.Tensor, widened: dict[tuple, tuple]) -> _Merged:
    """`widened`: (total, ids of the mask rows) -> (widened mask, the rows it was made from, held alive)."""
    total = keys.shape[3]
    if len(pending) == 1 and pending[0].allowed.shape[-1] == total:
        p = pending[0]
        return _Merged(p.q, p.weights, p.allowed, keys, list(range(p.q.shape[3])) if p.decode else [])
    q = torch.cat([p.q for p in pending], dim=3)  # [E, B, H, S, d]
    weights = None if pending[0].weights is None else torch.cat([p.weights for p in pending], dim=3)
    key = (total, *(id(p.allowed) for p in pending))
    if key not in widened:
        widened[key] = (widened_rows([p.allowed for p in pending], total), [p.allowed for p in pending])
    answer_rows, at = [], 0
    for p in pending:
        count = p.q.shape[3]
        if p.decode:
            answer_rows.extend(range(at, at + count))
        at += count
    return _Merged(q, weights, widened[key][0], keys, answer_rows)


def _detached(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.detach() if tensor is not None and tensor.requires_grad else tensor


def _to_host(collected: list[list[torch.Tensor]], num_layers: int) -> torch.Tensor | None:
    """Per-layer lists of [B, H, S_i, N] blocks -> [layers, B, H, sum S_i, N] on the CPU, zeros where a layer holds
    none, or None when none does. Stacked on the device with one shared zero block and copied back once: zeroing
    and filling the megabytes of absent layers on the host took longer than scoring them."""
    per_layer = [(r[0] if len(r) == 1 else torch.cat(r, dim=2)) if r else None for r in collected]
    present = next((t for t in per_layer if t is not None), None)
    if present is None:
        return None
    zero = torch.zeros_like(present) if any(t is None for t in per_layer) else None
    return torch.stack([zero if t is None else t for t in per_layer]).cpu()


class _Spans:
    """Key spans (one list for every row, or one per row) and their 0/1 [rows, last end, spans] matrix on the
    model's device: mass = probs[..., :end] @ matrix, one matmul instead of a cumsum and two gathers. Rows with
    fewer spans get zero mass in the extra columns. The matrix is built where it is used, from index vectors: a
    32k-token prompt's (39 MB for 300 passages) filled on the host and copied took tens of milliseconds per call."""

    def __init__(self, spans: list[tuple[int, int]] | list[list[tuple[int, int]]]):
        self.per_row = [list(r) for r in spans] if spans and isinstance(spans[0], list) else [list(spans)]
        self.end = max((e for row in self.per_row for _, e in row), default=0)
        self.width = max((len(r) for r in self.per_row), default=0)
        self._matrix: torch.Tensor | None = None

    def on(self, device: torch.device) -> torch.Tensor:
        if self._matrix is None or self._matrix.device != device:
            self._matrix = span_matrix(self.per_row, self.end, self.width, device)
        return self._matrix


def span_matrix(per_row: list[list[tuple[int, int]]], end: int, width: int, device: torch.device) -> torch.Tensor:
    """The 0/1 [rows, end, width] matrix with matrix[b, t, p] = 1 for t in row b's span p."""
    matrix = torch.zeros(len(per_row), end, width, device=device)
    index = span_index(per_row)
    if index.shape[1]:
        r, k, c = to_device_async(torch.from_numpy(index), device)  # one host-to-device copy
        matrix[r, k, c] = 1.0
    return matrix


def span_index(per_row: list[list[tuple[int, int]]]) -> np.ndarray:
    """(row, key, span) of every key inside a span, [3, n]. In numpy: a probe is made per call, and the same
    dozen steps as torch CPU ops cost more host time than the whole scoring they prepare."""
    flat = [(b, p, start, stop) for b, row in enumerate(per_row) for p, (start, stop) in enumerate(row)]
    if not flat:
        return np.zeros((3, 0), dtype=np.int64)
    rows, columns, starts, stops = np.asarray(flat, dtype=np.int64).T
    lengths = np.clip(stops - starts, 0, None)
    offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    keys = np.arange(int(lengths.sum()), dtype=np.int64) + offsets
    return np.stack([np.repeat(rows, lengths), keys, np.repeat(columns, lengths)])
