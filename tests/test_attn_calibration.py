"""attn-calibration on the real SmolLM2-135M: strength 0 is the baseline, offsets keep the passages' total mass,
a planted fact in the middle gets more of the answer's attention, and decoding with the cache equals
recomputation with the bias in place."""

from __future__ import annotations

import pytest
import torch

from midlens.core.errors import MethodConfigError
from midlens.generators import Generator
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.methods.attn_calibration import dummy_prompt, passage_offsets
from midlens.generators.methods.registry import method_config
from tests.conftest import planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"
GOLD_AT = 4  # the middle of 8 passages


@pytest.fixture(scope="module")
def calibrated(loaded):
    return Generator(loaded, method="attn-calibration")


@pytest.fixture(scope="module")
def prompt(calibrated):
    return calibrated.prompt(QUESTION, planted_passages(8, gold_at=GOLD_AT), max_new_tokens=6)


def test_strength_zero_is_the_baseline_exactly(generator, loaded, prompt):
    zero = Generator(loaded, method="attn-calibration(strength=0)")
    assert zero.parts.answering is None  # no early calibration pass, no bias: nothing that could differ
    a, b = generator.generate(prompt, max_new_tokens=6), zero.generate(prompt, max_new_tokens=6)
    assert a.text == b.text
    assert torch.equal(a.maps.answer, b.maps.answer)


def test_offsets_keep_the_total_passage_mass_and_reach_the_target(calibrated, prompt):
    maps = calibrated.score(prompt).maps
    layers = calibrated.parts.answering.layers
    mass, null = maps.question[list(layers)], maps.null_question[list(layers)]  # [L, H, P] of real attention
    for strength in (1.0, 0.5):
        b = passage_offsets(mass, null, strength, temperature=0.05).double()
        m = mass.double()
        total = m.sum(-1)
        # With b added to a passage's keys, the passages' share of the row is sum m e^b / (sum m e^b + 1 - M).
        moved = (m * b.exp()).sum(-1)
        share = moved / (moved + 1 - total)
        assert (share - total).abs().max().item() < 1e-5
    target = total[..., None] * torch.softmax((m - null.double()) / 0.05, dim=-1)
    reached = m * passage_offsets(mass, null, 1.0, 0.05).double().exp()
    assert torch.allclose(reached, target, atol=1e-6)  # strength 1: each passage gets its calibrated share


def test_a_planted_fact_in_the_middle_gets_more_of_the_answers_attention(generator, calibrated, prompt):
    """Through the public outputs: the answer the calibrated generator writes attends to the planted passage more
    than the baseline's answer does, on the layers it calibrates; its prefill evidence (read before any bias) is
    the baseline's."""
    # Two tokens: the first answer token, fed back, is the one query whose attention `maps.answer` holds; when both
    # generators wrote the same first token, the two maps compare the same query with and without the bias.
    base = generator.generate(prompt, max_new_tokens=2)
    ours = calibrated.generate(prompt, max_new_tokens=2)
    assert base.answer_ids[0] == ours.answer_ids[0]
    layers, gold = list(calibrated.parts.answering.layers), GOLD_AT - 1
    plain_gold = base.maps.answer[layers, :, gold].mean().item()
    biased_gold = ours.maps.answer[layers, :, gold].mean().item()
    assert biased_gold > 1.2 * plain_gold, (plain_gold, biased_gold)
    # Mass moves between passages; the passages' total stays close (exact for the question rows the offsets were
    # computed from): within 10 % here.
    plain_total = base.maps.answer[layers].sum(-1).mean().item()
    biased_total = ours.maps.answer[layers].sum(-1).mean().item()
    assert biased_total == pytest.approx(plain_total, rel=0.10)
    assert torch.allclose(base.maps.question, ours.maps.question, atol=1e-5)


def test_decoding_with_the_cache_equals_recomputation(loaded, calibrated, prompt):
    maps = calibrated.score(prompt).maps
    ids = prompt.input_ids
    with calibrated.running(), _applied(calibrated, maps, prompt):
        cache = new_cache()
        calibrated.forward(ids[:-1], cache)  # the prompt without its last token: unbiased rows
        logits = calibrated.forward(ids[-1:], cache)[-1]
        steps, generated = [logits], []
        for _ in range(4):
            generated.append(int(logits.argmax()))
            logits = calibrated.forward(generated[-1:], cache)[-1]
            steps.append(logits)
        full = calibrated.forward(ids + generated, new_cache(), keep=len(generated) + 1)
    # fp32, same kernels per row: differences are summation order only (logits are O(10)).
    assert (torch.stack(steps) - full).abs().max().item() < 1e-3


def _applied(gen, maps, prompt):
    """The method's bias from one prompt's maps, for its answer queries (the last prompt token on)."""
    end = prompt.num_tokens
    return gen.parts.answering.applied([maps], [prompt.passage_spans], end, start=end - 1, device=gen.device)


def test_bad_options_are_refused_before_loading():
    for spec, match in (
        ("attn-calibration(strength=-1)", "strength"),
        ("attn-calibration(temperature=0)", "temperature"),
        ("attn-calibration(layers='middle')", "layers"),
        ("attn-calibration(query='answer')", "query"),
        ("attn-calibration(heads=[1, 2])", "heads"),
        ("attn-calibration(calibration='mean')", "calibration"),
    ):
        with pytest.raises(MethodConfigError, match=match):
            method_config(spec)


def test_retrieval_heads_only_bias_those_heads(loaded, prompt):
    gen = Generator(loaded, method="attn-calibration(heads='retrieval', layers='all')")
    from midlens.generators.methods.retrieval_heads import retrieval_heads

    pairs = retrieval_heads(loaded)
    assert set(gen.parts.answering.layers) == {layer for layer, _ in pairs}
    maps = gen.score(prompt).maps
    with gen.running(), _applied(gen, maps, prompt):
        for layer in gen.parts.answering.layers:
            bias = gen.parts.schemes[layer].bias[0]  # [B, H, T] -> the one row's
            biased_heads = {h for h in range(bias.shape[0]) if bias[h].abs().sum() > 0}
            assert biased_heads <= {h for lay, h in pairs if lay == layer}
    assert all(gen.parts.schemes[layer].bias is None for layer in gen.parts.answering.layers)  # cleared after


def test_dummy_document_calibration(loaded, prompt):
    gen = Generator(loaded, method="attn-calibration(calibration='dummy')")
    dummy = dummy_prompt(gen.tokenizer, prompt)
    # Same slots: as many passages, each within 3 tokens of the original (decode/re-encode may merge a token at
    # the seams), so the dummy's slot k sits where the real passage k sits; same question, no passage content.
    assert len(dummy.passages) == len(prompt.passages)
    for (s, e), (ds, de) in zip(prompt.passage_spans, dummy.passage_spans, strict=True):
        assert abs((e - s) - (de - ds)) <= 3 and abs(s - ds) <= 3 * len(prompt.passages)
    assert dummy.question == prompt.question and "Zorbland" not in dummy.text.split("Question:")[0]

    answer = gen.generate(prompt, max_new_tokens=4)
    assert answer.method_state["bias_question"].shape == answer.maps.question.shape
    assert "bias_s" in answer.timings
    # The bias maps are positional only: every slot holds the same filler, so no slot may stand out the way the
    # planted fact does in the real prompt (its share of the question's passage mass, upper layers, mean over heads).
    layers = list(gen.parts.answering.layers)
    real = answer.maps.question[layers].mean((0, 1))
    bias = answer.method_state["bias_question"][layers].mean((0, 1))
    gold = GOLD_AT - 1
    assert (real[gold] / real.sum()) / (bias[gold] / bias.sum()) > 1.5, (real, bias)
    # Offsets from share-normalised relevance still keep the passages' total mass (1e-5).
    mass, null = answer.maps.question[layers], answer.method_state["bias_question"][layers]
    b = passage_offsets(mass, null, 1.0, 0.05, shares=True).double()
    m = mass.double()
    moved = (m * b.exp()).sum(-1)
    assert ((moved / (moved + 1 - m.sum(-1))) - m.sum(-1)).abs().max().item() < 1e-5
