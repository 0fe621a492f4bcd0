"""Attention scores: the one place where queries meet keys.

Everything that reads or applies attention builds on the functions here: the attention module's output
(`attend`, SDPA's fused kernel), a MoICE expert run on its routed queries only, Ms-PoE's head ranking, and
the probe that reads evidence (`attention_probs`, the same softmax written out for a few rows). What a query
may see and the logit bias a method adds are folded into one mask by `score_mask` and cut into rows by
`mask_rows`, so a change to masks, biases or the scale cannot reach the model's output and miss its evidence.

Shapes: q [B, H, S, d]; keys and values [B, Hk, T, d] with H a multiple of Hk (grouped-query attention).
A mask is None (causal, the queries being the chunk's last S positions of T), bool [B|1, 1|H, S, T]
(True = visible), or additive fp32 logits of that shape (0 visible, -inf hidden, plus a method's key bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[..., G, T, d] -> [..., heads, T, d], repeating each kv head for its query heads (GQA)."""
    groups = x.shape[-3]
    return x if groups == heads else x.repeat_interleave(heads // groups, dim=-3)


def additive(mask: torch.Tensor | None, length: int, total: int, device: torch.device) -> torch.Tensor:
    """A mask as additive fp32 logits (0 visible, -inf hidden), causal when no mask was given."""
    if mask is None:
        if length == 1:
            return torch.zeros(1, 1, 1, total, device=device)
        mask = torch.ones(length, total, dtype=torch.bool, device=device).tril(total - length)
    if mask.dtype != torch.bool:
        return mask.float()
    return torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))


def score_mask(
    attention_mask: torch.Tensor | None,
    key_bias: torch.Tensor | None,
    length: int,
    total: int,
    device: torch.device,
) -> torch.Tensor | None:
    """The mask every score of this forward is computed under: the model's mask (cut to the keys in hand),
    causal with an offset for a chunk after a cached prefix, plus a method's additive key bias, if any."""
    mask = attention_mask
    if mask is not None and mask.shape[-1] != total:
        mask = mask[..., :total]
    if mask is None and 1 < length < total:
        mask = torch.ones(length, total, dtype=torch.bool, device=device).tril(total - length)
    if key_bias is not None:
        mask = additive(mask, length, total, device) + key_bias.to(device)
    return mask


def mask_rows(mask: torch.Tensor | None, rows: torch.Tensor, past: int, total: int) -> torch.Tensor:
    """The mask of the queries at chunk indices `rows` ([B, S], or [B, H, S] per head) -> [B, 1|H, S, T].

    A None mask is causal: row r of a chunk that starts after `past` cached keys sees keys 0..past+r."""
    if rows.dim() == 2:
        rows = rows[:, None]
    if mask is None:
        return torch.arange(total, device=rows.device) <= (past + rows)[..., None]
    heads = max(mask.shape[1], rows.shape[1])
    full = mask.expand(rows.shape[0], heads, mask.shape[2], mask.shape[3])
    index = rows.expand(rows.shape[0], heads, rows.shape[2])[..., None].expand(-1, -1, -1, mask.shape[3])
    return full.gather(2, index)


def attend(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q K^T * scale + mask) V, fused (SDPA): what the model applies. [B, H, S, d]."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # SDPA wants an additive mask in the query's dtype
    return F.scaled_dot_product_attention(
        q,
        keys,
        values,
        attn_mask=mask,
        is_causal=mask is None and q.shape[2] > 1,
        scale=scale,
        enable_gqa=keys.shape[1] != q.shape[1],
    )


def attention_probs(q: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(q K^T * scale + mask) written out, in fp32: [B, H, S, T]. For a few rows only (S << T); the
    explicit form of `attend`'s weights, so what is read equals what is applied."""
    batch, heads, rows, dim = q.shape
    key_heads, total = keys.shape[1], keys.shape[2]
    # The query heads that share a key head are grouped instead of copying K per query head (GQA).
    grouped = q.float().reshape(batch, key_heads, -1, dim)
    logits = (grouped @ keys.float().transpose(-1, -2)).view(batch, heads, rows, total)
    # Scale and mask in place on the product this function owns (autograd keeps the product's inputs, not it):
    # scoring holds two [B, H, S, T] tensors instead of three. A mask broadcasts over [B, H, S, T], never beyond.
    logits.mul_(scale)
    if mask is None:
        mask = mask_rows(None, torch.arange(total - rows, total, device=q.device)[None], 0, total)
    if mask.dtype == torch.bool:
        logits.masked_fill_(~mask, float("-inf"))
    else:
        logits.add_(mask.float())
    return torch.softmax(logits, dim=-1)
