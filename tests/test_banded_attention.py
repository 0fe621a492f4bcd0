"""A windowed prefill attends a block of queries at a time against only the keys the block sees (scores._banded_attend).

Tolerance: 1e-5 on attention outputs of unit scale (fp32): the hidden keys carry exactly zero weight, so leaving them
out changes only the order of the kernel's sums (~1e-7 measured); a key dropped that a query sees moves outputs by
1e-2 or more. Against transformers, the families' own 1e-4 on logits (tests/test_families.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from midlens.generators import Generator
from midlens.generators.attention import arithmetic as scores
from midlens.generators.attention.arithmetic import attend
from midlens.generators.attention.masks import score_mask, window_rows
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.models.loading import load_model
from tests.tiny import VOCAB_SIZE, save_tiny


def _qkv(length: int, batch: int = 1, heads: int = 4, kv_heads: int = 1, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, length, dim, generator=g)
    k = torch.randn(batch, kv_heads, length, dim, generator=g)
    v = torch.randn(batch, kv_heads, length, dim, generator=g)
    return q, k, v


def _reference(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("window", [100, 600])
def test_a_windowed_prefill_in_blocks_equals_the_whole_mask(window):
    length = 2 * scores.BAND_QUERIES + 300  # blocks of 512, the last one short
    q, k, v = _qkv(length)
    mask = score_mask(None, None, length, length, q.device, window)
    banded = scores._banded_attend(q, k, v, mask, 0.25)
    assert banded is not None  # the window cuts the later blocks' keys
    assert (banded - _reference(q, k, v, mask)).abs().max() < 1e-5
    assert (attend(q, k, v, mask, 0.25) - banded).abs().max() == 0


def test_left_padded_rows_under_a_window_equal_the_whole_mask():
    length = 3 * scores.BAND_QUERIES
    q, k, v = _qkv(length, batch=2)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, :700] = False  # the second row is 700 columns shorter
    allowed = valid[:, None, None, :] & torch.ones(length, length, dtype=torch.bool).tril()
    allowed |= torch.eye(
        length, dtype=torch.bool
    )  # a padding query sees itself (generators.attention.masks.padded_causal)
    mask = score_mask(allowed, None, length, length, q.device, 256)
    banded = scores._banded_attend(q, k, v, mask, 0.25)
    assert banded is not None and (banded - _reference(q, k, v, mask)).abs().max() < 1e-5


def test_causal_or_padded_attention_without_a_window_runs_whole():
    """No window: nothing changes on models without one (their outputs stay bit-identical)."""
    length = 3 * scores.BAND_QUERIES
    q, k, v = _qkv(length, batch=2)
    valid = torch.ones(2, length, dtype=torch.bool)
    valid[1, :300] = False
    causal = valid[:, None, None, :] & torch.ones(length, length, dtype=torch.bool).tril()
    assert scores._banded_attend(q, k, v, causal, 0.25) is None
    short = score_mask(None, None, 600, 600, q.device, 256)  # under two blocks
    assert scores._banded_attend(*_qkv(600), short, 0.25) is None


@pytest.mark.parametrize(("length", "total", "window"), [(40, 40, 16), (1, 40, 16), (5, 40, 7), (40, 40, 64)])
def test_window_rows_are_the_keys_within_the_window(length, total, window):
    q_cols = torch.arange(total - length, total)[:, None]
    distance = q_cols - torch.arange(total)[None]
    assert torch.equal(window_rows(length, total, window, torch.device("cpu")), (distance >= 0) & (distance < window))


def test_window_rows_are_built_once_per_shape_and_mode():
    with torch.inference_mode():
        a, b = window_rows(64, 64, 8, torch.device("cpu")), window_rows(64, 64, 8, torch.device("cpu"))
    assert a is b
    trained = window_rows(64, 64, 8, torch.device("cpu"))  # outside inference mode: one a backward may save
    assert trained is not a and not trained.is_inference() and torch.equal(trained, a)


@pytest.mark.parametrize("name", ["gemma3", "mistral"])
def test_a_windowed_family_in_blocks_equals_transformers(name, tmp_path, monkeypatch):
    """Blocks of 8 queries on the tiny families (window 16, 40-token prompt): every later block is cut by the
    window, and the logits still equal transformers' SDPA forward within 1e-4 at the prefill and a decode step."""
    monkeypatch.setattr(scores, "BAND_QUERIES", 8)
    calls = []
    original = scores._banded_attend
    monkeypatch.setattr(scores, "_banded_attend", lambda *a: calls.append(1) or original(*a))
    folder = save_tiny(name, tmp_path / name)
    loaded = load_model(str(folder), "cpu", "float32")
    stock = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = torch.randint(3, VOCAB_SIZE, (1, 41), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = stock(input_ids=ids).logits[0]
    gen = Generator(loaded, method="baseline")
    with gen.running(None):
        cache = new_cache()
        ours = gen.forward(ids[0, :40].tolist(), cache, keep=40)
        step = gen.forward([int(ids[0, 40])], cache)
    assert calls  # the banded path ran
    assert (ours - ref[:40]).abs().max() < 1e-4
    assert (step - ref[40:]).abs().max() < 1e-4
