"""Attention Buckets: N RoPE bases as batch rows of one forward, logits mixed per decode step.

Tolerance 1e-4 (fp32) where a run is compared with another: the same products summed in another order.
"""

from __future__ import annotations

import pytest
import torch

from midlens.core.errors import MethodConfigError
from midlens.generators import Generator
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope import RotaryScheme
from midlens.generators.methods.attention_buckets import BucketScheme, bucket_bases, mix_logits
from midlens.generators.methods.registry import method_config
from midlens.generators.methods.rope_bases import rope_base
from tests.conftest import planted_passages

TOL = 1e-4
QUESTION = "What is the secret code word of the Zorbland expedition?"


def _answers(gen: Generator):
    prompt = gen.prompt(QUESTION, planted_passages(5, 2))
    return gen.generate(prompt, max_new_tokens=6, reference="pelican")


def _same(a, b) -> None:
    assert a.text == b.text
    assert abs(a.reference_logprob - b.reference_logprob) < TOL
    for x, y in zip(a.passages, b.passages, strict=True):
        assert abs(x.score - y.score) < TOL and x.rank == y.rank


def test_one_bucket_and_identical_buckets_are_the_baseline(loaded):
    """One native base is the stock model; N copies of the native base mix N equal distributions (weights 1/N), so
    the answer, its log-probability and its evidence are the baseline's too: the mixing and the evidence
    weighting are checked where the result is known."""
    baseline = _answers(Generator(loaded, method="baseline"))
    native = rope_base(loaded.model.config)
    _same(baseline, _answers(Generator(loaded, method="attention-buckets(buckets=1)")))
    _same(baseline, _answers(Generator(loaded, method=f"attention-buckets(bases=[{native}, {native}, {native}])")))


def test_each_row_rotates_with_its_own_base(loaded):
    config = loaded.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    bases = [10000.0, 40000.0, 160000.0]
    scheme = BucketScheme(bases, head_dim, config.num_attention_heads, config.num_key_value_heads)
    q, k = torch.randn(6, 9, 5, head_dim), torch.randn(6, 3, 5, head_dim)
    positions = torch.arange(5)[None].expand(6, -1)
    q_rot, k_rot = scheme.rotate(q, k, positions, None)
    for row in range(6):  # rows 0..5 are instances 0, 1, 2, 0, 1, 2
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        plain = RotaryScheme((bases[row % 3] ** -exponents).float(), 9, 3)
        q_ref, k_ref = plain.rotate(q[row : row + 1], k[row : row + 1], positions[:1], None)
        torch.testing.assert_close(q_rot[0, row], q_ref[0, 0])
        torch.testing.assert_close(k_rot[0, row], k_ref[0, 0])


def test_the_most_confident_instance_counts_most():
    logits = torch.tensor([[[0.0, 4.0, 0.0], [1.0, 0.0, 0.0]]])  # one prompt, two instances, vocab 3
    mixed, weights = mix_logits(logits)
    expected = torch.softmax(torch.tensor([4.0, 1.0]), 0)
    torch.testing.assert_close(weights[0], expected)
    torch.testing.assert_close(mixed[0], expected[0] * logits[0, 0] + expected[1] * logits[0, 1])


def test_the_bases_are_derived_for_the_model_native_first(loaded):
    config = loaded.model.config
    bases = bucket_bases(config, 4)
    assert len(set(bases)) == 4 and bases[0] == rope_base(config)
    assert all(rope_base(config) < b <= 2.5 * rope_base(config) for b in bases[1:])
    assert Generator(loaded, method="attention-buckets").parts.schemes[0].bases == bases


def test_buckets_change_the_answer_distribution(loaded):
    """Four different bases are not the baseline: the gold answer's log-probability moves (a method that did
    nothing would pass the equality tests above)."""
    baseline = _answers(Generator(loaded, method="baseline"))
    buckets = _answers(Generator(loaded, method="attention-buckets"))
    assert abs(buckets.reference_logprob - baseline.reference_logprob) > 1e-3


@pytest.mark.parametrize(
    "spec, message",
    [
        ("attention-buckets(buckets=0)", "buckets=0: the number of RoPE bases"),
        ("attention-buckets(bases=[])", "non-empty list of positive RoPE bases"),
        ("attention-buckets(bases=[10000, -5])", "non-empty list of positive RoPE bases"),
    ],
)
def test_bad_options_say_what_to_give(spec, message):
    with pytest.raises(MethodConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        method_config(spec)


def test_methods_inspection_names_the_bases_and_draws_them_into_a_new_folder(loaded, tmp_path):
    from midlens.generators.methods.attention_buckets import inspect_bases

    gen = Generator(loaded, method="attention-buckets(buckets=3)")
    lines = inspect_bases(gen, [], tmp_path / "not-yet")
    bases = gen.parts.schemes[0].bases
    assert ", ".join(f"{b:g}" for b in bases) in lines[0] and "3x" in lines[0]
    assert (tmp_path / "not-yet" / "attention_buckets_bases.png").stat().st_size > 10_000


def test_the_bench_runs_every_instance_as_a_row(loaded):
    """`midlens bench attention-buckets` times N rows, not the native-base instance alone (which is the baseline:
    its prefill, decode and memory read 1.00x the baseline's before)."""

    from midlens.eval.bench_runner import _generator_runner, bench_prompt

    prompt = bench_prompt(loaded.tokenizer, 64)
    gen = Generator(loaded, method="attention-buckets(buckets=3)")
    cache = new_cache()
    with gen.running():
        first = gen.forward(prompt.input_ids, cache, rows=3)
    assert cache.layers[0].keys.shape[0] == 3  # three instances cached, as the answer path runs them
    with gen.running():
        alone = gen.forward(prompt.input_ids, new_cache())
    torch.testing.assert_close(first, alone)  # row 0 is the native-base instance, whatever rows beside it
    runner = _generator_runner("attention-buckets(buckets=3)", loaded, prompt)
    assert runner.decode(2, False) > 0  # decoding one row after three cached ones would fail on the cache's shape
