"""The citation scoring passes (generators.answering.citation_scoring) against the answering loop they replaced.

`scored_evidence` (the `evidence_from` method's evidence) and `forced_logprobs` (verification's teacher-forced
pass) each prefill a batch of their own instead of running the decode loop with nothing to decode; what they
return must be exactly what that loop returned (`score_batch`'s passages, a reference's token log-probabilities):
the same forwards in the same order, so equality is exact. Tiny random-weight models (Llama's plain RoPE and
Phi-3's LongRoPE): the passes' bookkeeping, not a model's quality, is under test.
"""

from __future__ import annotations

import pytest

from midlens.core.passage import Passage
from midlens.generators import Generator, load_model
from midlens.generators.answering import decoding
from midlens.generators.answering.citation_scoring import forced_logprobs
from midlens.generators.answering.citations import MeasuredCitations
from midlens.generators.answering.passage_evidence import scored_evidence
from midlens.generators.answering.prefill import rope_groups
from tests.conftest import planted_passages
from tests.tiny import save_tiny


@pytest.fixture(scope="module", params=["llama", "phi3"])
def tiny(request, tmp_path_factory):
    folder = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    return load_model(str(folder), "cpu", "float32")


def _prompts(gen: Generator):
    """Three prompts of different lengths (every row padded differently)."""

    def short(n: int, gold: int) -> list[Passage]:
        return [Passage(text=p.text[:90], title=p.title, id=p.id) for p in planted_passages(n, gold)]

    return [
        gen.prompt("What is the secret code word?", short(5, 2), max_new_tokens=8),
        gen.prompt("Who directed the film?", short(3, 1), max_new_tokens=8),
        gen.prompt("Which river is it?", short(4, 4)[:3], max_new_tokens=8),
    ]


@pytest.mark.parametrize("calibrate", [True, False])
def test_scored_evidence_is_score_batch_passages(tiny, calibrate):
    scorer = Generator(tiny, method="ms-poe", citations=None)
    prompts = _prompts(scorer)
    expected = [a.passages for a in scorer.score_batch(prompts, calibrate=calibrate)]
    assert scored_evidence(scorer, prompts, calibrate) == expected  # every score of every passage, exactly


def test_forced_logprobs_are_the_reference_logprobs(tiny):
    gen = Generator(tiny, method="baseline")
    prompts = _prompts(gen)
    answers = [gen.tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("the pelican", "a film", "river")]
    loop = gen.generate_batch(prompts, max_new_tokens=0, calibrate=False, references=answers)
    assert forced_logprobs(gen, prompts, answers) == [a.reference_token_logprobs for a in loop]


def test_an_answer_with_evidence_from_enters_the_decode_loop_once(tiny, monkeypatch):
    """The scorer's evidence comes from its own pass, not from a second run of the loop (which the scorer's
    `score_batch` was): one decode loop per batch of one RoPE regime, and the answers still cite."""
    gen = Generator(tiny, method="baseline", citations=MeasuredCitations(evidence_from="ms-poe"))
    assert gen.evidence_scorer is not None
    prompts = _prompts(gen)
    groups = len(rope_groups(tiny.model, gen.tokenizer, prompts, 6, [None] * len(prompts)))
    entered: list[int] = []
    loop = decoding._batch_steps

    def counted(gen, prompts, *args):
        entered.append(len(prompts))
        return (yield from loop(gen, prompts, *args))

    monkeypatch.setattr(decoding, "_batch_steps", counted)
    answers = gen.generate_batch(prompts, max_new_tokens=6, ignore_eos=True)
    assert len(entered) == groups and sum(entered) == len(prompts)  # each row decoded once, in its regime's batch
    assert all(a.generated_tokens == 6 for a in answers)
    assert any(a.citations for a in answers)
