"""The probe's host-side parts, rewritten for GPU prefill speed, against their plain definitions: the span matrix,
the in-place score function, the copy back with absent layers as zeros, and token ids as a tensor. No model."""

from __future__ import annotations

import random

import pytest
import torch

from midlens.core.device import id_tensor
from midlens.generators.attention.arithmetic import attention_probs
from midlens.generators.attention.masks import mask_rows
from midlens.generators.attention.probe import PassageProbe, span_matrix


def _loop_matrix(per_row: list[list[tuple[int, int]]], end: int, width: int) -> torch.Tensor:
    out = torch.zeros(len(per_row), end, width)
    for b, row in enumerate(per_row):
        for p, (start, stop) in enumerate(row):
            out[b, start:stop, p] = 1.0
    return out


def test_span_matrix_marks_exactly_each_spans_keys():
    rng = random.Random(0)
    per_row = []
    for _ in range(5):  # rows of different span counts, empty and zero-length spans included
        cuts = sorted(rng.sample(range(1, 60), rng.randrange(0, 12)))
        row = [(a, b) for a, b in zip(cuts, cuts[1:], strict=False)] + [(7, 7)]
        per_row.append(row)
    per_row.append([])
    end = max(e for row in per_row for _, e in row)
    width = max(len(r) for r in per_row)
    assert torch.equal(span_matrix(per_row, end, width, torch.device("cpu")), _loop_matrix(per_row, end, width))


@pytest.mark.parametrize("mask_kind", ["causal", "bool", "additive"])
def test_scores_equal_the_written_out_softmax(mask_kind):
    torch.manual_seed(0)
    batch, heads, key_heads, rows, total, dim = 2, 6, 2, 3, 17, 8
    q, keys = torch.randn(batch, heads, rows, dim), torch.randn(batch, key_heads, total, dim)
    if mask_kind == "causal":
        mask, visible, bias = None, mask_rows(None, torch.arange(total - rows, total)[None], 0, total), 0.0
    else:
        visible = mask_rows(None, torch.tensor([[4, 9, 16], [2, 3, 16]]), 0, total)
        bias = torch.randn(batch, 1, rows, total) if mask_kind == "additive" else 0.0
        additive = torch.zeros(visible.shape).masked_fill(~visible, float("-inf")) + bias
        mask = visible if mask_kind == "bool" else additive
    expanded = keys.repeat_interleave(heads // key_heads, dim=1)  # each key head copied for its query heads
    logits = (q @ expanded.transpose(-1, -2)) * 0.3 + bias
    reference = torch.softmax(logits.masked_fill(~visible, float("-inf")), -1)
    # Grouped heads and in-place scaling sum the same products in the same order up to fp32 rounding.
    assert torch.allclose(attention_probs(q, keys, mask, 0.3), reference, atol=1e-6)


def test_take_returns_zeros_for_layers_it_does_not_keep():
    torch.manual_seed(0)
    layers, heads, total, dim = 4, 2, 9, 4
    probe = PassageProbe([(0, 3), (3, 9)], layers, layers=[1, 3])
    probe.score_rows([2, 8])
    keys = torch.randn(1, 1, heads, total, dim)
    for layer in range(layers):
        probe.observe(layer, torch.randn(1, 1, heads, total, dim), keys, None, 0, None, 0.5)
    taken = probe.take()
    assert taken.shape == (layers, 1, heads, 2, 2)
    assert taken[[0, 2]].abs().sum() == 0
    # Kept layers: each row's mass over the two spans is its whole attention (the spans cover every key it sees).
    assert torch.allclose(taken[[1, 3]].sum(-1), torch.ones(2, 1, heads, 2), atol=1e-6)
    assert taken[1, 0, :, 0, 1].abs().sum() == 0  # row 2 sees keys 0..2 only: nothing in the second span
    with pytest.raises(RuntimeError, match="no scoring row was observed"):
        probe.take()


def test_id_tensor_is_the_long_tensor_of_the_ids():
    ids = list(range(150_000, 150_000 + 300)) + [0, 1]
    assert torch.equal(id_tensor(ids), torch.tensor(ids, dtype=torch.long))
    assert id_tensor([]).dtype == torch.long and id_tensor([]).numel() == 0
