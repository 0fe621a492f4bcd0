"""Attention masks: which keys each query may see, written once as small composable functions.

The mask functions are transformers' own (`transformers.masking_utils`, pinned in pyproject): a mask function
takes broadcastable index tensors (batch row, head, query column, key column) and returns a bool tensor (True =
visible); `and_masks` / `or_masks` combine them, `causal_mask_function` is the causal rule,
`sliding_window_overlay` the window (and it with the causal rule: `sliding_window_causal_mask_function`),
`padding_mask_function` a row's padding (True = a key of the row), and `sdpa_mask` evaluates one over a chunk of
queries (`dense`). midlens adds `itself` (a padding query keeps its own key), `at_queries` (evaluation at arbitrary
query columns per row or head) and what it builds from them: the model's mask (`padded_causal`), the mask every
score is computed under (`score_mask`), the rows a probe or a routed expert scores (`mask_rows`) and a probe's
stacked rows (`widened_rows`), so these cannot drift apart, nor from the masks transformers' own forward builds.
tests/test_masks.py pins the transformers functions' semantics (window edges, padding convention) element-wise.

Columns, not positions: a query at column i of a left-padded row sees key column j. The real tokens of a row are
contiguous, so column distance is position distance (what a window counts), as in transformers'
`sliding_window_overlay`.

A mask handed on is None (causal: the queries are the chunk's last S of T columns), bool [B|1, 1|H, S, T] or
additive fp32 logits of that shape (0 visible, -inf hidden, plus a method's key bias).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    or_masks,
    padding_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

# (batch row, head, query column, key column) -> visible, each a broadcastable index tensor.
MaskFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def itself(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """A query sees its own column (or-ed in, a padding query keeps one key: an all-hidden row would be NaN, and NaN
    values poison the rows that hide them, 0 * NaN). transformers has no such function."""
    return kv == q


def dense(function: MaskFunction, length: int, total: int, device: torch.device, batch: int = 1) -> torch.Tensor:
    """`function` evaluated for the chunk's last `length` of `total` columns -> bool [batch, 1, length, total] (an
    expanded view where the function ignores the batch row): transformers' `sdpa_mask`, never skipped to None,
    without vmap (index tensors broadcast against each other)."""
    return sdpa_mask(
        batch,
        length,
        total,
        q_offset=total - length,
        mask_function=function,
        allow_is_causal_skip=False,
        use_vmap=False,
        device=device,
    )


def at_queries(function: MaskFunction, queries: torch.Tensor, total: int, batch: int = 1) -> torch.Tensor:
    """`function` evaluated for the query columns `queries` [B|1, 1|H, S] -> bool [B|batch, 1|H, S, total] (what
    transformers' `sdpa_mask` does without vmap, at query columns that need not be contiguous nor shared by the rows:
    `sdpa_mask` takes one contiguous range)."""
    device = queries.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    kv = torch.arange(total, device=device)[None, None, None, :]
    out = function(b, h, queries[..., None], kv)
    return out.expand(out.shape[0], out.shape[1], queries.shape[2], total)


def padded_causal(key_valid: torch.Tensor, length: int, all_valid: bool | None = None) -> torch.Tensor | None:
    """The model's mask for a chunk of `length` queries in the last columns of `key_valid` [B, T]: causal, padding
    hidden, each query seeing itself -> bool [B, 1, L, T]; None when every key is valid (plain causal attention).
    `all_valid`, when the caller knows it, spares reading `key_valid` back (a wait for the GPU's queue)."""
    if all_valid is None:
        all_valid = bool(key_valid.all())
    if all_valid:
        return None
    function = or_masks(and_masks(causal_mask_function, padding_mask_function(key_valid)), itself)
    return dense(function, length, key_valid.shape[1], key_valid.device, batch=key_valid.shape[0])


def window_rows(length: int, total: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [length, total]: the keys the chunk's last `length` queries see through a sliding window, causal
    included (transformers' `sliding_window_causal_mask_function`: keys fewer than `window` columns behind the
    query; its overlay compares kv against q - window, so the build is a bool matrix, never an int64 distance one,
    8x the memory).

    Every windowed layer of a forward asks for the same rows (twice at a prefill): they are built once and shared
    (read-only), as transformers builds its sliding mask once per forward. Built per layer they cost 30 [L, T] builds
    per Gemma 3 prefill. Tensors made in inference mode cannot be saved for a training step's backward, so each mode
    has its own."""
    return _window_rows(length, total, window, device, torch.is_inference_mode_enabled())


@functools.lru_cache(maxsize=4)
def _window_rows(length: int, total: int, window: int, device: torch.device, _inference: bool) -> torch.Tensor:
    return dense(sliding_window_causal_mask_function(window), length, total, device)[0, 0]


def as_additive(mask: torch.Tensor | None, length: int, total: int, device: torch.device) -> torch.Tensor:
    """A mask as additive fp32 logits (0 visible, -inf hidden), causal when no mask was given."""
    if mask is None:
        if length == 1:
            return torch.zeros(1, 1, 1, total, device=device)
        mask = dense(causal_mask_function, length, total, device)
    if mask.dtype != torch.bool:
        return mask.float()
    return torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))


def score_mask(
    attention_mask: torch.Tensor | None,
    key_bias: torch.Tensor | None,
    length: int,
    total: int,
    device: torch.device,
    window: int | None = None,
) -> torch.Tensor | None:
    """The mask every score of this forward is computed under: the model's mask (cut to the keys in hand), causal
    with an offset for a chunk after a cached prefix, the layer's sliding window, if it has one and the keys reach
    beyond it, plus a method's additive key bias, if any. None: plain causal over the chunk (SDPA's own)."""
    mask = attention_mask
    if mask is not None and mask.shape[-1] != total:
        mask = mask[..., :total]
    if window is not None and total > window:
        seen = window_rows(length, total, window, device)
        if mask is None:
            mask = seen[None, None]
        elif mask.dtype == torch.bool:
            mask = mask & seen
        else:
            mask = mask.masked_fill(~seen, float("-inf"))
    if mask is None and 1 < length < total:  # a chunk after cached keys: SDPA's is_causal would align it left
        mask = dense(causal_mask_function, length, total, device)
    if key_bias is not None:
        mask = as_additive(mask, length, total, device) + key_bias.to(device)
    return mask


def mask_rows(mask: torch.Tensor | None, rows: torch.Tensor, past: int, total: int) -> torch.Tensor:
    """The mask of the queries at chunk indices `rows` ([B, S], or [B, H, S] per head) -> [B, 1|H, S, T].

    A None mask is causal: row r of a chunk that starts after `past` cached keys sees keys 0..past+r."""
    if rows.dim() == 2:
        rows = rows[:, None]
    if mask is None:
        return at_queries(causal_mask_function, past + rows, total, rows.shape[0])
    heads = max(mask.shape[1], rows.shape[1])
    full = mask.expand(rows.shape[0], heads, mask.shape[2], mask.shape[3])
    index = rows.expand(rows.shape[0], heads, rows.shape[2])[..., None].expand(-1, -1, -1, mask.shape[3])
    return full.gather(2, index)


def causal_rows(rows: int, total: int, device: torch.device) -> torch.Tensor:
    """bool [1, 1, rows, total]: the causal mask of a chunk's last `rows` queries (where no mask was given)."""
    return dense(causal_mask_function, rows, total, device)


def widened_rows(rows: list[torch.Tensor], total: int) -> torch.Tensor:
    """Observed forwards' mask rows [B|1, 1|H, S_i, T_i] -> one [B|1, 1|H, sum S_i, T] mask: the keys a row had
    not seen yet hidden, so each row is scored exactly as it was when it was observed."""
    additive = any(r.dtype != torch.bool for r in rows)
    heads = max(r.shape[1] for r in rows)
    batch = max(r.shape[0] for r in rows)
    count = sum(r.shape[2] for r in rows)
    first = rows[0]
    if additive:
        out = torch.full((batch, heads, count, total), float("-inf"), device=first.device)
    else:
        out = torch.zeros(batch, heads, count, total, dtype=torch.bool, device=first.device)
    at = 0
    for row in rows:
        if additive:
            row = as_additive(row, row.shape[2], row.shape[-1], row.device)
        out[:, :, at : at + row.shape[2], : row.shape[-1]] = row
        at += row.shape[2]
    return out
