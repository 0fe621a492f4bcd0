"""Evidence from the model's own attention: planted facts, calibration, answer attribution, sampling."""

from __future__ import annotations

import pytest

from midlens.generators.attention.evidence import EvidenceConfig, aggregate
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.models.prompt import StackedPrompt
from tests.conftest import PLANTED_FACT, planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"


@pytest.mark.parametrize("gold_at", [1, 4, 8])
def test_planted_fact_ranks_first_with_the_default_aggregation(generator, gold_at):
    """Default = mean over the question's tokens, upper half of the layers (best of the 15 aggregations measured
    on this prompt family: gold rank 1 at every position, raw and calibrated; last-token/all-layers ranks it 2-8)."""
    prompt = generator.prompt(QUESTION, planted_passages(8, gold_at), max_new_tokens=8)
    answer = generator.generate(prompt, max_new_tokens=8)
    gold = answer.passages[gold_at - 1]
    assert gold.passage.text == PLANTED_FACT
    assert gold.rank == 1
    assert gold.evidence == max(p.evidence for p in answer.passages)
    assert gold.calibrated == max(p.calibrated for p in answer.passages)
    assert sorted(p.rank for p in answer.passages) == list(range(1, 9))


def test_result_fields_and_timings(generator):
    prompt = generator.prompt(QUESTION, planted_passages(4, 2), max_new_tokens=6)
    answer = generator.generate(prompt, max_new_tokens=6)
    assert answer.prompt_tokens == prompt.num_tokens
    assert 1 <= answer.generated_tokens <= 6
    assert {"prefill_s", "decode_s", "calibrate_s"} <= set(answer.timings)
    assert [p.position for p in answer.passages] == [1, 2, 3, 4]
    null = aggregate(answer.maps.null_question, answer.evidence_config)
    for p, n in zip(answer.passages, null, strict=True):
        assert 0.0 <= p.evidence <= 1.0
        assert p.calibrated == pytest.approx(p.evidence - n, abs=1e-7)
    if answer.generated_tokens > 1:
        assert all(p.answer_attribution is not None for p in answer.passages)
    d = answer.to_dict()
    assert d["passages"][0]["passage"]["text"] and "maps" not in d
    assert d["method"] == {"name": "baseline"}


def test_calibration_equals_a_separate_full_run_of_the_null_prompt(generator):
    """The cached-prefix N/A pass must give the same rows as running the N/A prompt from scratch."""
    from midlens.generators.models.prompt import CONTENT_FREE_QUESTION

    passages = planted_passages(4, 3)
    real = generator.generate(generator.prompt(QUESTION, passages), max_new_tokens=3)
    null = generator.score(generator.prompt(CONTENT_FREE_QUESTION, passages), calibrate=False)
    # Both are fp32 softmax rows of the same positions; the cached path only changes kernel order.
    assert (real.maps.null_question - null.maps.question).abs().max().item() < 1e-5
    assert (real.maps.null_last - null.maps.last).abs().max().item() < 1e-5


def test_reference_logprob_on_the_cache_equals_one_full_forward(generator):
    """generate(reference=...) scores the gold answer on the prompt's cached keys, after decoding has grown
    the cache; it must equal log p(answer | prompt) from one uncached forward over prompt + answer, and
    must leave the calibration (which crops the same cache further) untouched."""
    import torch

    prompt = generator.prompt(QUESTION, planted_passages(4, 3), max_new_tokens=6)
    with_ref = generator.generate(prompt, max_new_tokens=6, reference="pelican feathers")
    plain = generator.generate(prompt, max_new_tokens=6)
    ids = generator.tokenizer("pelican feathers", add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = generator.model(input_ids=torch.tensor([prompt.input_ids + ids])).logits[0].float()
    n = prompt.num_tokens
    full = torch.log_softmax(logits[n - 1 : n - 1 + len(ids)], -1)[torch.arange(len(ids)), torch.tensor(ids)].sum()
    # fp32 sums of a few log-probs; cached vs uncached attention differs by kernel order only (~1e-5 per logit).
    assert with_ref.reference_logprob == pytest.approx(float(full), abs=1e-3)
    assert plain.reference_logprob is None and with_ref.text == plain.text
    assert [p.calibrated for p in with_ref.passages] == pytest.approx([p.calibrated for p in plain.passages], abs=1e-6)
    with pytest.raises(ValueError, match="reference answer is empty"):
        generator.generate(prompt, max_new_tokens=6, reference="")  # refused before any decoding


def test_score_without_generation_and_without_calibration(generator):
    prompt = generator.prompt(QUESTION, planted_passages(4, 2))
    scored = generator.score(prompt, calibrate=False)
    assert scored.text == "" and scored.generated_tokens == 0
    assert all(p.calibrated is None for p in scored.passages)
    assert scored.passages[1].rank == 1


def test_sampling_is_seeded_and_streaming_matches_generate(generator):
    prompt = generator.prompt(QUESTION, planted_passages(3, 1), max_new_tokens=8)
    a = generator.generate(prompt, max_new_tokens=8, temperature=0.9, seed=7, calibrate=False)
    b = generator.generate(prompt, max_new_tokens=8, temperature=0.9, seed=7, calibrate=False)
    assert a.text == b.text
    stream = generator.stream(prompt, max_new_tokens=8, calibrate=False)
    pieces = list(stream)
    greedy = generator.generate(prompt, max_new_tokens=8, calibrate=False)
    assert "".join(pieces).strip() == greedy.text == stream.answer.text


def test_evidence_config_validation(generator):
    from midlens.generators import Generator

    with pytest.raises(ValueError, match="out of range"):
        Generator(generator.loaded, evidence=EvidenceConfig(layers=[0, 99]))


def test_a_new_turn_ends_the_answer(generator):
    # After a finished assistant turn the model's next token opens a new one (<|im_start|>); decoding hides
    # special tokens, so continuing would glue "user ..." onto the answer. Any special token stops generation.
    tokenizer = generator.tokenizer
    turns = [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}]
    text = tokenizer.apply_chat_template(turns, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = StackedPrompt(text, ids, [], [], "Say yes.", (len(ids) - 1, len(ids)))
    with generator.running():
        next_token = int(generator.forward(ids, new_cache())[-1].argmax())
    assert next_token in tokenizer.all_special_ids  # the premise: this prompt does end in a new turn
    answer = generator.generate(prompt, max_new_tokens=5, calibrate=False)
    assert answer.generated_tokens == 0 and answer.text == ""


@pytest.mark.parametrize("text", ["The capital of France is Paris.\nThe capital of Italy is", "Shopping list:"])
def test_stop_at_line_end_decodes_only_the_line_the_metrics_read(generator, text):
    from midlens.eval.metrics import first_line

    ids = generator.tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = StackedPrompt(text, ids, [], [], "x", (len(ids) - 1, len(ids)))
    full = generator.generate(prompt, max_new_tokens=24, calibrate=False)
    short = generator.generate(prompt, max_new_tokens=24, calibrate=False, stop_at_line_end=True)
    assert "\n" in full.text  # the premise: unstopped, the model writes more than one line
    assert short.text == first_line(full.text).strip() != ""
    assert short.generated_tokens < full.generated_tokens
