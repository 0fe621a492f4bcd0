"""Batched generation: every row of a left-padded batch equals the same prompt answered alone.

Tolerance: 1e-4 on evidence maps and log-probabilities, fp32. A batch changes only the summation order of the
same products (padding columns are masked to exactly zero weight), so rows differ by float rounding, ~1e-5
at most on SmolLM2 over 30 layers (measured); greedy text must be identical.
"""

from __future__ import annotations

import pytest
import torch

from midlens.core.passage import Passage
from midlens.generators import Generator, load_model
from tests.conftest import planted_passages
from tests.tiny import save_tiny

TOL = 1e-4
MAP_FIELDS = ("last", "question", "answer", "null_last", "null_question")


def assert_rows_equal(singles, batch) -> None:
    assert len(singles) == len(batch)
    for alone, row in zip(singles, batch, strict=True):
        assert row.text == alone.text
        assert row.generated_tokens == alone.generated_tokens
        for name in MAP_FIELDS:
            a, b = getattr(alone.maps, name), getattr(row.maps, name)
            assert (a is None) == (b is None), name
            if a is not None:
                assert a.shape == b.shape, name
                assert a.numel() == 0 or (a - b).abs().max().item() < TOL, name
        assert alone.method_state.keys() == row.method_state.keys()
        for name, a in alone.method_state.items():  # a method's own maps (attn-calibration's bias maps)
            assert (a - row.method_state[name]).abs().max().item() < TOL, name
        assert (alone.reference_logprob is None) == (row.reference_logprob is None)
        if alone.reference_logprob is not None:
            assert abs(alone.reference_logprob - row.reference_logprob) < TOL
        assert [p.rank for p in row.passages] == [p.rank for p in alone.passages]
        # The picked tokens' log-probabilities (what the support score reads), and the support itself.
        assert len(row.token_logprobs) == len(alone.token_logprobs) == len(row.answer_ids)
        assert all(abs(a - b) < TOL for a, b in zip(alone.token_logprobs, row.token_logprobs, strict=True))
        assert (alone.support is None) == (row.support is None)
        if alone.support is not None:
            assert abs(alone.support.probability - row.support.probability) < 1e-3


def _smol_prompts(gen: Generator):
    """Three prompts of different lengths and passage counts (so every row is padded differently)."""
    return [
        gen.prompt("What is the secret code word of the Zorbland expedition?", planted_passages(5, 2)),
        gen.prompt("Who directed the film?", planted_passages(3, 1)),
        gen.prompt("Which river is it?", planted_passages(4, 4)[:3]),
    ]


@pytest.mark.parametrize(
    "method",
    [
        "baseline",
        "ms-poe",
        "mudaf",
        "mudaf(alpha=0)",
        "moice",
        "attn-calibration",
        "attn-calibration(calibration='dummy')",
        "attention-buckets(buckets=3)",
        "channel-scaling",
    ],
)
def test_every_method_batched_equals_each_prompt_alone_on_smollm2(loaded, method):
    gen = Generator(loaded, method=method)
    prompts = _smol_prompts(gen)
    references = ["pelican", "Wim Wenders", None]
    singles = [gen.generate(p, max_new_tokens=6, reference=r) for p, r in zip(prompts, references, strict=True)]
    assert_rows_equal(singles, gen.generate_batch(prompts, max_new_tokens=6, references=references))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request, tmp_path_factory):
    return load_model(str(save_tiny(request.param, tmp_path_factory.mktemp(request.param))), "cpu", "float32")


def _tiny_passages(n: int) -> list[Passage]:
    return [Passage(text=f"the code word of city {i} is {i * 7}", title=f"city {i}") for i in range(n)]


@pytest.mark.parametrize("method", ["baseline", "ms-poe(layers=[1, 2, 3])", "attn-calibration(layers=[1, 2, 3])"])
def test_rows_stop_on_their_own_and_stream_per_row(tiny, method):
    gen = Generator(tiny, method=method)
    prompts = [
        gen.prompt("what is the code word of city 2 ?", _tiny_passages(4)),
        gen.prompt("who ?", _tiny_passages(1)),
        gen.prompt("which city ?", []),  # no passages: no evidence, still answered
    ]
    for stop in (False, True):
        singles = [gen.generate(p, max_new_tokens=7, stop_at_line_end=stop) for p in prompts]
        pieces: dict[int, str] = {}

        def on_token(row: int, text: str, pieces: dict[int, str] = pieces) -> None:
            pieces[row] = pieces.get(row, "") + text

        batch = gen.generate_batch(
            prompts,
            max_new_tokens=7,
            stop_at_line_end=stop,
            on_token=on_token,
        )
        assert_rows_equal(singles, batch)
        for row, answer in enumerate(batch):
            assert pieces.get(row, "").strip() == answer.text


def test_scoring_a_batch_equals_scoring_each(tiny):
    gen = Generator(tiny)
    prompts = [gen.prompt("what is the code word of city 1 ?", _tiny_passages(n)) for n in (2, 5, 3)]
    assert_rows_equal([gen.score(p) for p in prompts], gen.score_batch(prompts))


def test_sampling_gives_each_row_the_stream_it_would_have_alone(tiny):
    gen = Generator(tiny)
    prompts = [gen.prompt("what is the code word of city 3 ?", _tiny_passages(n)) for n in (3, 1)]
    singles = [gen.generate(p, max_new_tokens=5, temperature=1.0, seed=7) for p in prompts]
    assert_rows_equal(singles, gen.generate_batch(prompts, max_new_tokens=5, temperature=1.0, seed=7))


def test_bad_batches_are_refused_with_what_to_do(tiny):
    gen = Generator(tiny)
    prompt = gen.prompt("who ?", _tiny_passages(1))
    with pytest.raises(ValueError, match="at least one prompt"):
        gen.generate_batch([])
    with pytest.raises(ValueError, match="2 references for 1 prompts"):
        gen.generate_batch([prompt], references=["a", "b"])


def test_padding_never_changes_a_row(tiny):
    """The same prompt padded by 0 and by 40 columns (beside a longer one) gives the same logits-driven answer and
    evidence: padding keys get exactly zero attention."""
    gen = Generator(tiny)
    short = gen.prompt("who ?", _tiny_passages(1))
    long = gen.prompt("what is the code word of city 4 ?", _tiny_passages(6))
    assert long.num_tokens - short.num_tokens > 40
    alone = gen.generate(short, max_new_tokens=4)
    padded = gen.generate_batch([long, short], max_new_tokens=4)[1]
    assert_rows_equal([alone], [padded])
    assert torch.isfinite(padded.maps.question).all()


def test_a_cancelled_row_stops_and_the_others_answer_as_alone(tiny):
    """A row cancelled mid-batch (its client left) stops at its next step; the rows beside it are untouched."""
    gen = Generator(tiny)
    prompts = [gen.prompt("what is the code word of city 2 ?", _tiny_passages(n)) for n in (4, 2, 3)]
    singles = [gen.generate(p, max_new_tokens=8, ignore_eos=True) for p in prompts]
    asked: list[int] = []

    def cancelled(row: int) -> bool:
        asked.append(row)
        return row == 1 and asked.count(1) > 2  # row 1 leaves after its second token

    batch = gen.generate_batch(prompts, max_new_tokens=8, ignore_eos=True, cancelled=cancelled)
    assert batch[1].generated_tokens == 2
    assert batch[1].answer_ids == singles[1].answer_ids[:2]
    assert_rows_equal([singles[0], singles[2]], [batch[0], batch[2]])
