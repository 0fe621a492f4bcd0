"""Position Interpolation and NTK-aware RoPE scaling: one plain RoPE scheme with other frequencies.

Tolerance 1e-4 (fp32): two routes to the same rotation differ in summation order only.
"""

from __future__ import annotations

import pytest
import torch

from midlens.core.errors import MethodConfigError
from midlens.generators import Generator
from midlens.generators.methods.registry import method_config
from midlens.generators.methods.rope_scaling import scaled_inv_freq
from tests.conftest import planted_passages

TOL = 1e-4


def _answer(gen: Generator, **kwargs):
    prompt = gen.prompt("What is the secret code word of the Zorbland expedition?", planted_passages(4, 2))
    return gen.generate(prompt, max_new_tokens=5, reference="pelican", **kwargs)


def _same(a, b) -> None:
    assert a.text == b.text
    assert abs(a.reference_logprob - b.reference_logprob) < TOL
    for x, y in zip(a.passages, b.passages, strict=True):
        assert abs(x.score - y.score) < TOL


def test_factor_one_is_the_baseline_and_pi_is_ms_poe_with_one_ratio_everywhere(loaded):
    baseline = _answer(Generator(loaded, method="baseline"))
    for kind in ("linear", "ntk"):
        _same(baseline, _answer(Generator(loaded, method=f"rope-scaling(kind='{kind}', factor=1.0)")))
    layers = list(range(loaded.model.config.num_hidden_layers))
    ms_poe = f"ms-poe(ratio_min=1.5, ratio_max=1.5, layers={layers})"
    pi = _answer(Generator(loaded, method="rope-scaling(factor=1.5)"))
    _same(pi, _answer(Generator(loaded, method=ms_poe)))
    assert abs(pi.reference_logprob - baseline.reference_logprob) > 1e-3  # and it is not the baseline


def test_ntk_keeps_the_highest_frequency_and_stretches_the_lowest():
    plain = scaled_inv_freq(10000.0, 64, "linear", 1.0)
    ntk = scaled_inv_freq(10000.0, 64, "ntk", 4.0)
    assert ntk[0] == plain[0] == 1.0
    torch.testing.assert_close(ntk[-1], plain[-1] / 4.0)  # base * f^(d/(d-2)) divides the last frequency by f
    torch.testing.assert_close(scaled_inv_freq(10000.0, 64, "linear", 4.0), plain / 4.0)


def test_batched_equals_alone(loaded):
    gen = Generator(loaded, method="rope-scaling(kind='ntk', factor=2.0)")
    prompts = [
        gen.prompt("What is the secret code word of the Zorbland expedition?", planted_passages(5, 2)),
        gen.prompt("Who directed the film?", planted_passages(3, 1)),
    ]
    singles = [gen.generate(p, max_new_tokens=5) for p in prompts]
    for alone, row in zip(singles, gen.generate_batch(prompts, max_new_tokens=5), strict=True):
        assert alone.text == row.text
        for x, y in zip(alone.passages, row.passages, strict=True):
            assert abs(x.score - y.score) < TOL


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rope-scaling(kind='yarn')", "choose 'linear' .Position Interpolation. or 'ntk'"),
        ("rope-scaling(factor=0)", "factor=0: a positive number"),
    ],
)
def test_bad_options_say_what_to_give(spec, message):
    with pytest.raises(MethodConfigError, match=message):
        method_config(spec)
