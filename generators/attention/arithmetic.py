"""Attention scores: the one place where queries meet keys.

Everything that reads or applies attention builds on the functions here: the attention module's output
(`attend`, SDPA's fused kernel), a MoICE expert run on its routed queries only, Ms-PoE's head ranking, and
the probe that reads evidence (`attention_probs`, the same softmax written out for a few rows). What a query
may see and the logit bias a method adds are folded into one mask by `generators.attention.masks.score_mask` and cut
into rows by its `mask_rows`, so a change to masks, biases or the scale cannot reach the model's output and miss its
evidence.

Shapes: q [B, H, S, d]; keys and values [B, Hk, T, d] with H a multiple of Hk (grouped-query attention).
A mask is None (causal, the queries being the chunk's last S positions of T), bool [B|1, 1|H, S, T]
(True = visible), or additive fp32 logits of that shape (0 visible, -inf hidden, plus a method's key bias).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from midlens.generators.attention.masks import causal_rows


@dataclass(frozen=True)
class Scoring:
    """How a layer turns q . k into logits: times `scale`, then, with `softcap` (Gemma 2), softcap * tanh(x /
    softcap), before the mask. A plain float where a scale is asked for means no soft-cap."""

    scale: float
    softcap: float | None = None


def as_scoring(scoring: float | Scoring) -> Scoring:
    return scoring if isinstance(scoring, Scoring) else Scoring(float(scoring))


# Soft-capped scores have no fused kernel: they are written out for this many queries at a time, so a long
# prefill holds [B, H, chunk, T] logits, never [B, H, T, T].
SOFTCAP_QUERY_CHUNK = 256


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, T, d] -> [..., heads, T, d], repeating each kv head for its query heads (GQA)."""
    groups = x.shape[-3]
    return x if groups == heads else x.repeat_interleave(heads // groups, dim=-3)


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scoring: float | Scoring
) -> torch.Tensor:
    """softmax(cap(q K^T * scale) + mask) V: what the model applies. [B, H, S, d]. Fused (SDPA) without a
    soft-cap; with one, `attention_probs`' own rows @ V, a chunk of queries at a time."""
    scoring = as_scoring(scoring)
    scale = scoring.scale
    if scoring.softcap is not None:
        return _capped_attend(q, keys, values, mask, scoring)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # SDPA wants an additive mask in the query's dtype
    elif mask is not None:
        band = _banded_attend(q, keys, values, mask, scale)
        if band is not None:
            return band
    return F.scaled_dot_product_attention(
        q,
        keys,
        values,
        attn_mask=mask,
        is_causal=mask is None and q.shape[2] > 1,
        scale=scale,
        enable_gqa=keys.shape[1] != q.shape[1],
    )


# Queries per block of a banded prefill (`_banded_attend`): each block reads its window plus this many keys.
BAND_QUERIES = 512


def _banded_attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor | None:
    """A CPU prefill under a sliding window, a block of queries at a time against only the key columns some query of
    the block sees; None when the mask hides no leading block of keys (no window shorter than the chunk: causal or
    padded attention runs whole, as before).

    SDPA's kernels compute every masked score of a [L, T] mask, so a 512-token window over a 2k prompt costs as much
    as full attention, and 16x that at 8k; the hidden keys get exactly zero weight, so leaving them out changes the
    output only by the order of the sums (~1e-7 in fp32). On a GPU the fused kernel is launch-bound at these sizes and
    reading the block bounds back would stall its queue: it runs whole there."""
    length, total = q.shape[2], keys.shape[2]
    if q.device.type != "cpu" or length < 2 * BAND_QUERIES or mask.shape[-2] != length:
        return None
    seen = mask.reshape(-1, length, total).any(0)  # [L, T]: some row or head sees the key
    starts = range(0, length, BAND_QUERIES)
    bounds = []
    for s in starts:  # bool reductions only: index arithmetic over [L, T] cost 5 % of a 2k prefill
        columns = seen[s : s + BAND_QUERIES].any(0).nonzero()
        bounds.append((int(columns[0]), int(columns[-1]) + 1))
    if max(lo for lo, _ in bounds) == 0:  # no window cuts a block's keys (causal or padded attention)
        return None
    gqa = keys.shape[1] != q.shape[1]
    out = [
        F.scaled_dot_product_attention(
            q[:, :, s : s + BAND_QUERIES],
            keys[:, :, lo:hi],
            values[:, :, lo:hi],
            attn_mask=mask[..., s : s + BAND_QUERIES, lo:hi],
            scale=scale,
            enable_gqa=gqa,
        )
        for s, (lo, hi) in zip(starts, bounds, strict=True)
    ]
    return torch.cat(out, dim=2)


def _capped_attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scoring: Scoring
) -> torch.Tensor:
    rows, total = q.shape[2], keys.shape[2]
    if mask is None:
        mask = causal_rows(rows, total, q.device)
    values = expand_heads(values, q.shape[1])
    out = []
    for start in range(0, rows, SOFTCAP_QUERY_CHUNK):
        stop = min(rows, start + SOFTCAP_QUERY_CHUNK)
        part = mask[:, :, start:stop] if mask.shape[2] > 1 else mask
        probs = attention_probs(q[:, :, start:stop], keys, part, scoring)
        out.append((probs @ values.float()).to(q.dtype))
    return torch.cat(out, dim=2)


def attention_probs(
    q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, scoring: float | Scoring
) -> torch.Tensor:
    """softmax(cap(q K^T * scale) + mask) written out, in fp32: [B, H, S, T]. For a few rows only (S << T); the
    explicit form of `attend`'s weights, so what is read equals what is applied."""
    scoring = as_scoring(scoring)
    batch, heads, rows, dim = q.shape
    key_heads, total = keys.shape[1], keys.shape[2]
    # The query heads that share a key head are grouped instead of copying K per query head (GQA).
    grouped = q.float().reshape(batch, key_heads, -1, dim)
    logits = (grouped @ keys.float().transpose(-1, -2)).view(batch, heads, rows, total)
    # Scale and mask in place on the product this function owns (autograd keeps the product's inputs, not it):
    # scoring holds two [B, H, S, T] tensors instead of three. A mask broadcasts over [B, H, S, T], never beyond.
    logits.mul_(scoring.scale)
    if scoring.softcap is not None:  # tanh's backward reads its output: the cap's product is a new tensor
        logits = torch.tanh(logits.div_(scoring.softcap)) * scoring.softcap
    if mask is None:
        mask = causal_rows(rows, total, q.device)
    if mask.dtype == torch.bool:
        logits.masked_fill_(~mask, float("-inf"))
    else:
        logits.add_(mask.float())
    return torch.softmax(logits, dim=-1)
