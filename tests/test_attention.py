"""The swapped attention module against stock transformers, and its evidence rows against eager attention."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.probe import PassageProbe
from midlens.generators.models.model_cache import resolve_model_dir
from tests.conftest import planted_passages

# fp32 on CPU; identical math in a different kernel order differs by ~1e-6. 1e-4 is the bound.
LOGIT_TOL = 1e-4
# Attention probabilities summed over spans: same math as eager's softmax rows, fp32.
ROW_TOL = 1e-5


@pytest.fixture(scope="module")
def stock():
    """An untouched copy of the same weights: the reference implementation."""
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_dir("smollm2-135m"), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    yield model
    del model


@pytest.fixture(scope="module")
def prompt(generator):
    return generator.prompt("What is the secret code word of the Zorbland expedition?", planted_passages(5, 3))


def test_logits_match_stock_without_cache(generator, stock, prompt):
    ids = torch.tensor([prompt.input_ids])
    with torch.inference_mode():
        ref = stock(ids).logits
        with generator.running(None):
            ours = generator.model(ids).logits
    assert (ref - ours).abs().max().item() < LOGIT_TOL


def test_logits_match_stock_with_kv_cache(generator, stock, prompt):
    """Prefill all but 4 tokens, then feed a 2-token chunk and 2 single tokens through the cache."""
    ids = prompt.input_ids
    cut = len(ids) - 4
    with torch.inference_mode():
        ref = stock(torch.tensor([ids])).logits[0, cut:]
        with generator.running(None):
            cache = new_cache()
            generator.forward(ids[:cut], cache)
            chunk = generator.forward(ids[cut : cut + 2], cache, keep=2)
            a = generator.forward(ids[cut + 2 : cut + 3], cache)
            b = generator.forward(ids[cut + 3 :], cache)
    ours = torch.cat([chunk, a, b])
    assert (ref - ours).abs().max().item() < LOGIT_TOL


def _eager_span_mass(stock, ids: list[int], rows: list[int], spans) -> torch.Tensor:
    """[layers, H, S, P] from transformers' eager attention: the reference the probe must reproduce."""
    stock.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            att = stock(torch.tensor([ids]), output_attentions=True).attentions
    finally:
        stock.set_attn_implementation("sdpa")
    return torch.stack([torch.stack([a[0][:, rows, s:e].sum(-1) for s, e in spans], dim=-1) for a in att])


def test_evidence_rows_equal_eager_attention(generator, stock, prompt):
    rows = list(range(*prompt.question_span)) + [prompt.num_tokens - 1]
    probe = PassageProbe(prompt.passage_spans, generator.num_layers)
    probe.score_rows(rows)
    cache = new_cache()
    with generator.running(probe):
        logits = generator.forward(prompt.input_ids, cache)
        ours = probe.take()[:, 0]  # [layers, H, S, P]
        # A decode step: the fed-back token's row, read against the cached keys.
        token = int(logits[-1].argmax())
        probe.score_rows([0])
        generator.forward([token], cache)
        ours_decode = probe.take()[:, 0]

    ref = _eager_span_mass(stock, prompt.input_ids, rows, prompt.passage_spans)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < ROW_TOL
    # The rows are real distributions over keys: passage mass can't exceed the whole row.
    assert ours.sum(-1).max().item() <= 1.0 + ROW_TOL
    ref_decode = _eager_span_mass(stock, prompt.input_ids + [token], [prompt.num_tokens], prompt.passage_spans)
    assert ours_decode.shape == ref_decode.shape
    assert (ours_decode - ref_decode).abs().max().item() < ROW_TOL
