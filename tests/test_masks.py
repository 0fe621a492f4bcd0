"""The mask functions against a dense reference written element by element from each rule's definition.

Every case is exact (bool masks, or additive masks of 0 / -inf plus a bias): a mask that shows one key too many or
too few changes attention, so the comparison is equality, on tiny sizes where the reference's loops are cheap.
The causal, window and padding rules and their combinators are transformers' (`masking_utils`): their semantics
(window edges, which padding value keeps a key) are pinned here against the rules midlens wrote before it used them.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    or_masks,
    padding_mask_function,
    sliding_window_causal_mask_function,
    sliding_window_overlay,
)

from midlens.generators.attention.masks import (
    as_additive,
    at_queries,
    causal_rows,
    dense,
    itself,
    mask_rows,
    padded_causal,
    score_mask,
    widened_rows,
    window_rows,
)

CPU = torch.device("cpu")


def reference(key_valid: torch.Tensor | None, length: int, total: int, window: int | None = None) -> torch.Tensor:
    """bool [B, 1, L, T] by definition: query column q = T - L + i sees key column k when k <= q, the key holds a
    token of the row (or is the query itself), and q - k < window."""
    batch = 1 if key_valid is None else key_valid.shape[0]
    out = torch.zeros(batch, 1, length, total, dtype=torch.bool)
    for b, i, k in itertools.product(range(batch), range(length), range(total)):
        q = total - length + i
        seen = k <= q and (key_valid is None or bool(key_valid[b, k]) or k == q)
        out[b, 0, i, k] = seen and (window is None or q - k < window)
    return out


def _valid(batch: int, total: int, seed: int = 0) -> torch.Tensor:
    """Left padding of random widths, and a hidden stretch in one row (a pass that hides the row's question)."""
    g = torch.Generator().manual_seed(seed)
    valid = torch.ones(batch, total, dtype=torch.bool)
    for b in range(batch):
        valid[b, : int(torch.randint(0, total // 2, (1,), generator=g))] = False
    valid[-1, total // 2 : total // 2 + 2] = False
    return valid


def _grid(batch: int, total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index tensors (batch row, head, query column, key column) broadcasting to [batch, 1, total, total]."""
    return (
        torch.arange(batch)[:, None, None, None],
        torch.zeros(1, 1, 1, 1, dtype=torch.long),
        torch.arange(total)[None, None, :, None],
        torch.arange(total)[None, None, None, :],
    )


def _elementwise(rule, batch: int, total: int) -> torch.Tensor:
    """bool [batch, 1, total, total]: `rule(b, q, kv)` on plain ints, one element at a time."""
    out = torch.zeros(batch, 1, total, total, dtype=torch.bool)
    for b, q, k in itertools.product(range(batch), range(total), range(total)):
        out[b, 0, q, k] = bool(rule(b, q, k))
    return out


def _evaluated(function, batch: int, total: int) -> torch.Tensor:
    out = function(*_grid(batch, total))
    assert out.dtype == torch.bool
    return out.expand(batch, 1, total, total)


@pytest.mark.parametrize("total", [1, 5, 8])
def test_transformers_mask_functions_are_midlens_rules_elementwise(total):
    """Each transformers function midlens uses, against the rule midlens wrote before it used them: causal kv <= q
    (a query sees itself), the window's keys fewer than `window` columns behind the query (kv > q - window, the far
    edge excluded), padding True = the key is kept, read at the row's own key column."""
    valid = _valid(3, max(total, 2), seed=4)[:, :total]
    assert torch.equal(_evaluated(causal_mask_function, 3, total), _elementwise(lambda b, q, k: k <= q, 3, total))
    assert torch.equal(_evaluated(itself, 3, total), _elementwise(lambda b, q, k: k == q, 3, total))
    assert torch.equal(
        _evaluated(padding_mask_function(valid), 3, total), _elementwise(lambda b, q, k: valid[b, k], 3, total)
    )
    for window in range(1, total + 2):
        assert torch.equal(
            _evaluated(sliding_window_overlay(window), 3, total),
            _elementwise(lambda b, q, k, w=window: k > q - w, 3, total),
        )
        assert torch.equal(
            _evaluated(sliding_window_causal_mask_function(window), 3, total),
            _elementwise(lambda b, q, k, w=window: k <= q and q - k < w, 3, total),
        )
    padded = or_masks(and_masks(causal_mask_function, padding_mask_function(valid)), itself)
    assert torch.equal(
        _evaluated(padded, 3, total), _elementwise(lambda b, q, k: (k <= q and valid[b, k]) or k == q, 3, total)
    )


def test_and_or_combine_elementwise():
    b, h, q, kv = _grid(1, 4)
    strictly_before = and_masks(causal_mask_function, lambda *_: ~itself(b, h, q, kv))
    assert torch.equal(strictly_before(b, h, q, kv), kv < q)
    assert torch.equal(or_masks(strictly_before, itself)(b, h, q, kv), causal_mask_function(b, h, q, kv))
    assert torch.equal(
        and_masks(causal_mask_function, sliding_window_overlay(2))(b, h, q, kv), (kv <= q) & (q - kv < 2)
    )


@pytest.mark.parametrize("length,total", [(5, 5), (2, 5), (1, 5)])
def test_dense_is_at_queries_over_the_chunks_last_columns(length, total):
    """`dense` (transformers' `sdpa_mask`) and `at_queries` (midlens' evaluation at any query columns) agree."""
    valid = _valid(2, total, seed=5)
    for function, batch in ((causal_mask_function, 1), (padding_mask_function(valid), 2), (itself, 2)):
        queries = torch.arange(total - length, total)[None, None, :]
        want = at_queries(function, queries, total, batch)
        got = dense(function, length, total, CPU, batch)
        assert got.shape == (batch, 1, length, total)  # expanded to the batch (a view) where the rows agree
        assert torch.equal(got, want.expand(batch, 1, length, total))


@pytest.mark.parametrize("length,total", [(7, 7), (3, 7), (1, 7)])
def test_padded_causal_is_the_reference(length, total):
    valid = _valid(3, total)
    assert torch.equal(padded_causal(valid, length), reference(valid, length, total))
    assert padded_causal(torch.ones(2, total, dtype=torch.bool), length) is None  # no padding: SDPA's causal


@pytest.mark.parametrize("length,total,window", [(9, 9, 3), (4, 9, 3), (1, 9, 4), (9, 9, 9), (6, 9, 1)])
def test_window_rows_are_the_reference(length, total, window):
    assert torch.equal(window_rows(length, total, window, CPU), reference(None, length, total, window)[0, 0])


@pytest.mark.parametrize("length,total", [(8, 8), (3, 8)])
def test_score_mask_ands_padding_and_window(length, total):
    valid = _valid(3, total, seed=1)
    model_mask = padded_causal(valid, length)
    expected = reference(valid, length, total, window=3)
    assert torch.equal(score_mask(model_mask, None, length, total, CPU, window=3), expected)
    # A mask longer than the keys in hand (the model's, made for the whole chunk) is cut to them first.
    longer = torch.cat([model_mask, torch.ones(3, 1, length, 2, dtype=torch.bool)], dim=-1)
    assert torch.equal(score_mask(longer, None, length, total, CPU, window=3), expected)
    # An additive mask is windowed with -inf; a key bias lands on the visible keys only.
    bias = torch.randn(1, 2, 1, total)
    scored = score_mask(model_mask, bias, length, total, CPU, window=3)
    want = torch.zeros(3, 2, length, total).masked_fill(~expected, float("-inf")) + bias
    assert torch.equal(scored, want)
    additive = score_mask(as_additive(model_mask, length, total, CPU), None, length, total, CPU, window=3)
    assert torch.equal(additive, torch.zeros(3, 1, length, total).masked_fill(~expected, float("-inf")))


def test_score_mask_without_a_model_mask_is_causal_with_the_offset():
    assert score_mask(None, None, 5, 5, CPU) is None  # a prefill: SDPA's causal
    assert score_mask(None, None, 1, 5, CPU) is None  # one decode step sees every key
    assert torch.equal(score_mask(None, None, 3, 7, CPU), reference(None, 3, 7))  # a chunk after 4 cached keys
    assert torch.equal(score_mask(None, None, 7, 7, CPU, window=2), reference(None, 7, 7, 2))
    assert score_mask(None, None, 7, 7, CPU, window=7) is None  # the window reaches every key: plain causal
    bias = torch.randn(1, 1, 1, 7)
    step = score_mask(None, bias, 1, 7, CPU)
    assert torch.equal(step, torch.zeros(1, 1, 1, 7) + bias)


def test_mask_rows_take_the_rows_of_the_mask_or_of_causal():
    valid = _valid(2, 6, seed=2)
    mask = padded_causal(valid, 4)
    rows = torch.tensor([[0, 3], [2, 1]])
    taken = mask_rows(mask, rows, past=2, total=6)
    assert torch.equal(taken, torch.stack([mask[b, :, rows[b]] for b in range(2)]))
    # Per head: each head's rows of a mask shared by the heads.
    per_head = torch.tensor([[[0, 1], [3, 3]], [[2, 0], [1, 2]]])
    taken = mask_rows(mask, per_head, past=2, total=6)
    assert torch.equal(taken, torch.stack([torch.stack([mask[b, 0, r] for r in per_head[b]]) for b in range(2)]))
    # No mask: row r of a chunk after `past` cached keys is query column past + r.
    full = reference(None, 4, 6)[0, 0]
    assert torch.equal(mask_rows(None, rows, past=2, total=6), torch.stack([full[r][None] for r in rows]))
    assert torch.equal(causal_rows(4, 6, CPU), reference(None, 4, 6))


def test_widened_rows_hide_the_keys_a_row_had_not_seen():
    early = padded_causal(_valid(2, 4, seed=3), 2)  # [2, 1, 2, 4]: two rows observed when 4 keys existed
    late = dense(causal_mask_function, 1, 6, CPU)  # [1, 1, 1, 6]: a decode step's row, 6 keys
    widened = widened_rows([early, late], 6)
    assert widened.shape == (2, 1, 3, 6)
    assert torch.equal(widened[:, :, :2, :4], early) and not widened[:, :, :2, 4:].any()
    assert torch.equal(widened[:, :, 2:], late.expand(2, 1, 1, 6))
    bias = torch.randn(1, 3, 1, 6)
    additive = as_additive(late, 1, 6, CPU) + bias  # a method's key bias on the later row: the whole is additive
    mixed = widened_rows([early, additive], 6)
    assert mixed.dtype == torch.float32 and mixed.shape == (2, 3, 3, 6)
    assert torch.equal(mixed[:, :, :2, :4], torch.zeros(2, 3, 2, 4).masked_fill(~early, float("-inf")))
    assert torch.equal(mixed[:, :, :2, 4:], torch.full((2, 3, 2, 2), float("-inf")))
    assert torch.equal(mixed[:, :, 2:], additive.expand(2, 3, 1, 6))


def test_padding_reads_each_rows_own_keys():
    valid = _valid(3, 5)
    b, h = torch.arange(3)[:, None, None, None], torch.zeros(1, 1, 1, 1, dtype=torch.long)
    seen = padding_mask_function(valid)(
        b, h, torch.zeros(1, 1, 1, 1, dtype=torch.long), torch.arange(5)[None, None, None, :]
    )
    assert torch.equal(seen[:, 0, 0], valid)
