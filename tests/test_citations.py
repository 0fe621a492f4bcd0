"""Citations per answer sentence, read from the answer's own attention and verified against the answer, on the
real SmolLM2-135M."""

from __future__ import annotations

import pytest

from midlens.core.errors import InvalidArgumentError, MethodConfigError
from midlens.core.passage import Passage
from midlens.core.sentences import sentence_spans
from midlens.generators import Generator
from midlens.generators.answering.citations import CitationConfig
from tests.conftest import PLANTED_FACT, planted_passages

QUESTION = "What is the secret code word of the Zorbland expedition?"
GOLD_AT = 3
# Batched rows equal rows alone up to summation order (tests/test_batch.py measures ~1e-5 on evidence maps).
TOL = 1e-4


@pytest.fixture(scope="module")
def planted(generator):
    prompt = generator.prompt(QUESTION, planted_passages(6, GOLD_AT))
    return prompt, generator.generate(prompt, max_new_tokens=24)


def test_the_answer_cites_the_planted_sentence_and_verification_keeps_it(generator, planted):
    prompt, answer = planted
    assert "pelican" in answer.text.lower()
    assert answer.citations, "an answer with passages gets citations"
    for citation in answer.citations:
        start, end = citation.span
        assert 0 <= start < end <= len(answer.text) and answer.text[start:end].strip()
    first = answer.citations[0]
    top = first.sources[0]
    assert top.position == GOLD_AT and top.passage_id == prompt.passages[GOLD_AT - 1].id
    gold = prompt.passages[GOLD_AT - 1]
    assert gold.text[top.sentence[0] : top.sentence[1]] == PLANTED_FACT
    assert sum(s.score for s in first.sources) <= 1.0 + 1e-6
    assert all(s.verified is None for c in answer.citations for s in c.sources)  # not checked yet

    generator.verify([prompt], [answer])
    # Removing the planted fact costs the answer many nats (about 17 measured); the margin is 0.5.
    assert top.verified is True and top.logprob_drop > 5.0
    for source in first.sources[1:]:  # a passage the answer does not rest on loses it little
        assert source.logprob_drop is not None
        assert source.verified == (source.logprob_drop >= generator.citations.margin)
    assert answer.to_dict()["citations"][0]["sources"][0]["verified"] is True


def test_a_rule_on_raw_evidence_ranks_passages_by_the_raw_evidence(generator, planted):
    prompt, _ = planted
    for weights in ({"evidence_weight": 1.0}, {"evidence_weight": 0.0, "raw_evidence_weight": 1.0}):
        # Evidence alone picks the passages, every passage cited, strongest first.
        config = CitationConfig(max_sources=10, min_share=0.0, **weights)
        gen = Generator(generator.loaded, method=generator.method.spec(), citations=config)
        answer = gen.generate(prompt, max_new_tokens=8)
        raw = "raw_evidence_weight" in weights
        evidence = [pe.evidence if raw else pe.calibrated for pe in answer.passages]
        assert max(evidence) > 0  # something to blend in, so the ranking below is the evidence's
        ranked = [s.position for s in answer.citations[0].sources]
        assert ranked[0] == max(range(len(evidence)), key=evidence.__getitem__) + 1
        # Evidence below zero earns no share (core.citation_rule.evidence_shares), so those tie at zero.
        shares = [max(e, 0.0) for e in evidence]
        assert [shares[p - 1] for p in ranked] == sorted(shares, reverse=True)


def test_citations_from_another_methods_evidence_rank_by_that_methods_evidence(generator, planted, loaded):
    prompt, _ = planted
    # Evidence alone picks the passages, so the cited order is the evidence's; the baseline answers, MuDAF's delta
    # reads the prompt (one more prefill) and its evidence is what is blended in.
    config = CitationConfig(max_sources=6, min_share=0.0, evidence_weight=1.0, evidence_from="mudaf")
    gen = Generator(loaded, method="baseline", citations=config)
    answer = gen.generate(prompt, max_new_tokens=8)
    assert "cite_evidence_s" in answer.timings
    mudaf = Generator(loaded, method="mudaf", citations=None).score(prompt).passages
    own = [pe.score for pe in answer.passages]
    theirs = [pe.score for pe in mudaf]
    assert own != theirs  # two readings of the prompt: the check below can tell them apart
    assert [pe.score for pe in generator.generate(prompt, max_new_tokens=8).passages] == pytest.approx(own)
    shares = [max(e, 0.0) for e in theirs]
    ranked = [s.position for s in answer.citations[0].sources]
    assert [shares[p - 1] for p in ranked] == sorted(shares, reverse=True)[: len(ranked)]
    assert len(ranked) == len(shares)  # min_share 0: every passage, strongest first
    # Streamed citations read the same evidence: each equals its entry in the final answer.
    streamed = []
    again = gen.generate(prompt, max_new_tokens=8, on_citation=streamed.append)
    assert [[s.position for s in c.sources] for c in streamed] == [
        [s.position for s in c.sources] for c in again.citations
    ]
    assert [[s.position for s in c.sources] for c in again.citations] == [
        [s.position for s in c.sources] for c in answer.citations
    ]
    # A rule on the raw evidence alone (the scorer's content-free pass is then skipped) ranks by MuDAF's raw reading.
    raw_rule = CitationConfig(6, 0.0, 0.0, raw_evidence_weight=1.0, evidence_from="mudaf")
    raw_answer = Generator(loaded, method="baseline", citations=raw_rule).generate(prompt, max_new_tokens=8)
    raw = [pe.evidence for pe in mudaf]
    assert [raw[s.position - 1] for s in raw_answer.citations[0].sources] == sorted(raw, reverse=True)
    # Naming the answering method itself is its own evidence: no second reading.
    assert Generator(loaded, method="mudaf", citations=config).evidence_scorer is None
    with pytest.raises(MethodConfigError, match="evidence_from"):
        Generator(loaded, method="baseline", citations=CitationConfig(evidence_from="no-such-method"))


def test_batched_citations_equal_each_answer_alone(generator):
    prompts = [
        generator.prompt(QUESTION, planted_passages(5, 2)),
        generator.prompt("Who directed the film?", planted_passages(3, 1)),
    ]
    batch = generator.generate_batch(prompts, max_new_tokens=12)
    for prompt, row in zip(prompts, batch, strict=True):
        alone = generator.generate(prompt, max_new_tokens=12)
        assert row.text == alone.text
        assert [c.span for c in row.citations] == [c.span for c in alone.citations]
        for a, b in zip(alone.citations, row.citations, strict=True):
            assert [s.position for s in a.sources] == [s.position for s in b.sources]
            assert [s.sentence for s in a.sources] == [s.sentence for s in b.sources]
            for x, y in zip(a.sources, b.sources, strict=True):
                assert abs(x.score - y.score) < TOL


def test_nothing_to_cite_and_odd_passages(generator, loaded):
    prompt = generator.prompt(QUESTION, planted_passages(3, 2))
    scored = generator.score(prompt)  # max_new_tokens=0: no answer, so no citations, and nothing to verify
    assert scored.text == "" and scored.citations == []
    assert generator.verify([prompt], [scored]) == [scored]

    long_sentence = "word " * 300  # one very long sentence, no boundary at all
    passages = [
        Passage(text=long_sentence + "the code is pelican", title="Run-on"),
        Passage(text="我们今天很高兴。秘密代码是鹈鹕。", title="中文"),
        Passage(text="Короткий текст. Ещё одно предложение!", title="Русский"),
    ]
    odd = generator.prompt("What is the code?", passages)
    answer = generator.generate(odd, max_new_tokens=8)
    for citation in answer.citations:
        for source in citation.sources:
            text = passages[source.position - 1].text
            start, end = source.sentence
            assert 0 <= start < end <= len(text) and text[start:end] == text[start:end].strip()
    assert [len(s) for s in odd.sentences] == [1, 2, 2]

    quiet = Generator(loaded, citations=None)
    assert quiet.generate(odd, max_new_tokens=4).citations == []
    with pytest.raises(InvalidArgumentError, match="citations are off"):
        quiet.verify([odd], [answer])


def test_verification_of_a_prompt_that_no_longer_fits_is_refused(generator, planted):
    prompt, answer = planted
    tight = Generator(generator.loaded)
    tight.loaded.context_window, saved = prompt.num_tokens + 2, tight.loaded.context_window
    try:
        with pytest.raises(InvalidArgumentError, match="no longer fit"):
            tight.verify([prompt], [answer])
    finally:
        tight.loaded.context_window = saved


def test_citation_options_are_checked():
    bad_options = (
        {"max_sources": 0},
        {"min_share": 2},
        {"margin": -1},
        {"evidence_weight": 1.5},
        {"raw_evidence_weight": -0.1},
        {"evidence_weight": 0.75, "raw_evidence_weight": 0.5},
        {"evidence_from": ""},
    )
    for bad in bad_options:
        with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
            CitationConfig(**bad)


def test_the_library_defaults_are_the_rule_eval_cite_grades():
    from midlens.eval.cite import DEFAULT_RULE

    # eval.cite spells the defaults out (importing CitationConfig there would load torch for the report).
    config = CitationConfig()
    assert {key: getattr(config, key) for key in DEFAULT_RULE} == DEFAULT_RULE


def test_a_generator_cites_by_the_rule_measured_for_its_model_and_method(loaded, monkeypatch):
    from midlens.generators.answering.citations import MEASURED_RULES

    # The shipped entry: chosen on the default model's train rows for MuDAF (docs/results/cite/README.md, 5).
    assert CitationConfig.measured("qwen2.5-coder-0.5b", "mudaf") == CitationConfig(2, 0.0, 0.75)
    # The fine-tune (`finetuned`, the answering default when these were measured) has its own (section 9), found
    # under the spec its shorthand stands for.
    from midlens.core.defaults import DEFAULT_MODEL

    default_spec = "mudaf(alpha=0)"
    assert CitationConfig.measured(DEFAULT_MODEL, default_spec) == CitationConfig(2, 0.3, 0.25, raw_evidence_weight=0.5)
    # SmolLM2's fine-tune has its own too (section 10) and verifies at the margin chosen for it (section 15), also
    # with another method's evidence; its baseline (the default now), nothing measured apart: the default rule.
    assert Generator(loaded, method="finetuned").citations == CitationConfig(3, 0.7, 0.75, margin=0.75)
    assert CitationConfig.measured(loaded.name, default_spec, "mudaf").margin == 0.75
    assert Generator(loaded, method="baseline").citations == CitationConfig() == Generator(loaded).citations
    monkeypatch.setitem(MEASURED_RULES, (loaded.name, "mudaf"), {"max_sources": 1, "min_share": 0.2})
    assert Generator(loaded, method="mudaf").citations == CitationConfig(max_sources=1, min_share=0.2)
    assert Generator(loaded, method="attn-calibration").citations == CitationConfig()  # another method spec
    assert Generator(loaded, method="mudaf", citations=CitationConfig()).citations == CitationConfig()  # given wins
    # With another method's evidence (section 12): its own entry where one was measured, else the method's rule.
    finetuned = CitationConfig.measured(DEFAULT_MODEL, default_spec, evidence_from="mudaf")
    assert finetuned == CitationConfig(2, 0.0, 0.0, raw_evidence_weight=0.75, evidence_from="mudaf")
    unmeasured = CitationConfig.measured(DEFAULT_MODEL, "mudaf", evidence_from="baseline")
    assert unmeasured == CitationConfig(2, 0.0, 0.75, evidence_from="baseline")
    assert unmeasured.margin == CitationConfig().margin  # no margin measured for MuDAF's delta answering
    with pytest.raises(InvalidArgumentError, match=r"citations='auto': pass a CitationConfig, \"measured\""):
        Generator(loaded, citations="auto")


def test_calibrated_evidence_removes_the_slot_prior_the_answer_attention_carries():
    from midlens.core.citation_rule import apply_rule, citation_scores

    # Four slots with a recency prior, as SmolLM2's answer attention has one (the last slot gets the most whatever
    # it holds). The supporting passage adds the same signal wherever it sits. The answer's attention is prior +
    # signal; calibrated evidence is the question's attention (prior + signal) minus a content-free query's
    # (the prior): the signal alone.
    prior = [0.15, 0.1, 0.1, 0.45]
    signal = 0.2
    for gold in range(4):
        raw = [q + (signal if p == gold else 0.0) for p, q in enumerate(prior)]
        answer = [x / sum(raw) for x in raw]
        calibrated = [r - q for r, q in zip(raw, prior, strict=True)]
        alone = apply_rule(citation_scores(answer, calibrated, 0.0), 1, 0.0)
        # Without the evidence the prior wins: the last slot is cited wherever the gold sits...
        assert alone == [4]
        # ...with it the gold is cited at every slot, the same for the train-chosen default weight.
        assert apply_rule(citation_scores(answer, calibrated, 1.0), 1, 0.0) == [gold + 1]
        default = CitationConfig()
        chosen = apply_rule(citation_scores(answer, calibrated, default.evidence_weight), 3, default.min_share)
        assert chosen == [gold + 1]


def test_evidence_shares_clip_negative_evidence_and_fall_back_to_the_answer():
    from midlens.core.citation_rule import citation_scores, evidence_shares

    # Calibrated evidence below the content-free query's earns no share; the rest sums to 1.
    assert evidence_shares([0.3, -0.2, 0.1, 0.0]) == pytest.approx([0.75, 0.0, 0.25, 0.0])
    assert evidence_shares([-0.1, 0.0]) is None
    answer = [0.2, 0.8]
    assert citation_scores(answer, [0.9, 0.1], 0.5) == pytest.approx([0.55, 0.45])
    assert sum(citation_scores(answer, [0.9, 0.1], 0.5)) == pytest.approx(1.0)
    # Nothing to blend in (no evidence, none positive, or weight 0): the answer's attention alone.
    assert citation_scores(answer, None, 1.0) == answer
    assert citation_scores(answer, [-0.1, -0.2], 1.0) == answer
    assert citation_scores(answer, [0.9, 0.1], 0.0) == answer
    with pytest.raises(ValueError, match="one per passage"):
        citation_scores(answer, [0.1, 0.2, 0.3], 0.5)


def test_sentence_spans_trim_and_keep_abbreviations():
    text = "Dr. Smith went to Washington.  He arrived at 3 p.m. on Monday! "
    assert [text[s:e] for s, e in sentence_spans(text)] == [
        "Dr. Smith went to Washington.",
        "He arrived at 3 p.m. on Monday!",
    ]
    assert sentence_spans("   ") == [] and sentence_spans("no boundary") == [(0, 11)]


def test_answer_sentences_past_the_last_token_end_belong_to_the_last_token():
    from midlens.generators.answering.citations import answer_sentences

    # A random-weight model can decode text whose last characters no single-token prefix decodes to (a
    # multi-byte character completed by the whole sequence): every sentence still maps to real tokens.
    assert answer_sentences("Abc. Def.", [3], lead=0) == [((0, 4), (0, 1)), ((5, 9), (0, 1))]
    assert answer_sentences("", [], lead=0) == []


def test_token_ends_split_multibyte_characters_where_they_complete(loaded):
    """Byte-level BPE splits a CJK character or an emoji over several tokens: the tokens before the last byte end
    where the previous token did, so no answer sentence starts or ends inside a character."""
    from midlens.generators.answering.citations import token_ends

    tokenizer = loaded.tokenizer
    text = "Tokyo is 東京. It rains 🌧 often, café."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ends = token_ends(tokenizer, ids)
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    assert len(ends) == len(ids) and ends == sorted(ends) and ends[-1] == len(decoded)
    assert len(set(ends)) < len(ends)  # some tokens end inside a character (this text has multi-token ones)
    for i, end in enumerate(ends):
        prefix = tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
        assert decoded[:end] == prefix[:end] and "\ufffd" not in decoded[:end]
