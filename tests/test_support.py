"""Support scores (generators.answering.support): the features, the fitted model as a verified artefact, the
log-probabilities they read from the decode loop, and the abstain option."""

from __future__ import annotations

import math

import pytest

from tests.conftest import PLANTED_FACT, planted_passages


def inputs(text="Brea", lps=(-0.1, -0.2), margins=(3.0, 1.0), sources=None, evidence=(0.1, 0.5, 0.2)):
    if sources is None:
        sources = [
            {
                "sentence_index": 0,
                "rank": 0,
                "position": 2,
                "share": 0.6,
                "sentence": "The first store opened in Brea, California.",
                "passage": "Torrid. The first store opened in Brea, California.",
                "drop": 3.0,
                "verified": True,
            },
            {
                "sentence_index": 0,
                "rank": 1,
                "position": 1,
                "share": 0.2,
                "sentence": "It sells clothes.",
                "passage": "It sells clothes.",
                "drop": 0.1,
                "verified": False,
            },
        ]
    return {
        "text": text,
        "token_logprobs": list(lps),
        "token_margins": list(margins),
        "sentences": 1,
        "sources": sources,
        "evidence": list(evidence),
        "attribution": [0.1, 0.6, 0.3],
    }


def test_features_read_what_the_answer_rests_on():
    from midlens.generators.answering.support import PLAIN_FEATURES, VERIFIED_FEATURES, support_features

    f = support_features(inputs())
    assert tuple(f) == PLAIN_FEATURES
    assert f["mean_logprob"] == pytest.approx(-0.15) and f["min_logprob"] == -0.2 and f["first_logprob"] == -0.1
    assert f["log_tokens"] == pytest.approx(math.log(3)) and f["first_margin"] == 3.0 and f["min_margin"] == 1.0
    assert f["top_share"] == 0.6 and f["share_margin"] == pytest.approx(0.4) and f["cited_sources"] == 2
    assert f["cited_is_top_evidence"] == 1.0  # passage 2 has the most evidence and is cited first
    assert f["evidence_peak"] == pytest.approx(0.5 / 0.8) and f["attribution_on_top_evidence"] == pytest.approx(0.6)
    assert f["words_in_cited_sentence"] == 1.0
    unsupported = support_features(inputs(text="Anaheim"))
    assert unsupported["words_in_cited_sentence"] == 0.0 and unsupported["words_in_cited_passage"] == 0.0
    v = support_features(inputs(), verified=True)
    assert tuple(v) == VERIFIED_FEATURES and v["max_drop"] == 3.0 and v["verified_share"] == 0.5
    # Nothing cited, nothing generated: defined values, no division by zero.
    empty = support_features(inputs(text="", lps=(), margins=(), sources=[]), verified=True)
    assert empty["top_share"] == 0.0 and empty["max_drop"] == 0.0 and empty["mean_logprob"] == -20.0


def _rows(n: int = 60) -> list[dict]:
    """Train rows where the answer is right exactly when its cited sentence holds its words (and its tokens are
    surer): a separable pattern a fitted model must find."""
    rows = []
    for i in range(n):
        right = i % 3 == 0
        lp = -0.05 - 0.01 * (i % 5) if right else -1.5 - 0.1 * (i % 4)
        rows.append({"inputs": inputs(text="Brea" if right else "Anaheim", lps=(lp, lp)), "em": float(right)})
    return rows


def test_a_fitted_model_separates_and_its_threshold_meets_the_precision_on_train():
    from midlens.generators.answering.support import SupportModel, choose_threshold, support_features

    rows = _rows()
    model = SupportModel.fit(rows, verified=False, name="smollm2-135m")
    ps = [model.probability(support_features(r["inputs"])) for r in rows]
    right = [p for p, r in zip(ps, rows, strict=True) if r["em"]]
    wrong = [p for p, r in zip(ps, rows, strict=True) if not r["em"]]
    assert min(right) > max(wrong)
    kept = [r["em"] for p, r in zip(ps, rows, strict=True) if p >= model.threshold]
    assert sum(kept) / len(kept) >= model.target_precision
    # The lowest threshold meeting the precision (the most answers kept at it): 3 of the top 4 are right, 3 of 5 not
    # enough; the top 3's 2 of 3 is under it too, but a lower threshold that meets it is what counts.
    assert choose_threshold([0.9, 0.8, 0.7, 0.6, 0.2, 0.1], [1, 1, 0, 1, 0, 0], 0.7) == 0.6
    # Unreachable precision: the best threshold keeping at least a tenth of the answers.
    assert choose_threshold([0.9, 0.8, 0.7], [0, 1, 0], 0.99) == 0.8
    with pytest.raises(Exception, match="all wrong"):
        SupportModel.fit([{**r, "em": 0.0} for r in rows], False, "x")


def test_a_support_model_saves_as_a_verified_artefact(tmp_path):
    from midlens.core.errors import ArtefactError
    from midlens.generators.answering.support import METHOD_PLAIN, METHOD_VERIFIED, SupportModel, support_features

    model = SupportModel.fit(_rows(), verified=True, name="m")
    meta = {"method": model.method, "base_model": "m", "base_model_sha256": "sha-of-m", "options": {}}
    folder = model.save(tmp_path / "m", {**meta, "training": {"answers": 60}, "data": {"rows": "synthetic"}})
    back, _ = SupportModel.load(folder, METHOD_VERIFIED, "sha-of-m")
    f = support_features(inputs(), verified=True)
    assert back.probability(f) == pytest.approx(model.probability(f), abs=1e-12) and back.threshold == model.threshold
    with pytest.raises(ArtefactError, match="not on the model loaded now"):
        SupportModel.load(folder, METHOD_VERIFIED, "another-model")
    with pytest.raises(ArtefactError, match="trained for method 'support-verified', not 'support'"):
        SupportModel.load(folder, METHOD_PLAIN, "sha-of-m")
    weights = folder / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ArtefactError, match="does not match"):
        SupportModel.load(folder, METHOD_VERIFIED, "sha-of-m")


@pytest.fixture(scope="module")
def planted_answer(generator):
    prompt = generator.prompt("What is the secret code word of the Zorbland expedition?", planted_passages(5, 2))
    return prompt, generator.generate(prompt, max_new_tokens=20)


def test_token_logprobs_are_what_teacher_forcing_gives_the_same_tokens(generator, planted_answer):
    """The log-probability recorded as each token was picked equals the one the same tokens get scored as a
    reference on the same prompt (another code path: the cached prompt, teacher-forced): fp32, 1e-4."""
    prompt, answer = planted_answer
    assert "pelican" in answer.text.lower() and len(answer.token_logprobs) == len(answer.answer_ids) > 0
    scored = generator.generate(prompt, max_new_tokens=0, reference=answer.answer_ids, calibrate=False)
    assert all(abs(a - b) < 1e-4 for a, b in zip(answer.token_logprobs, scored.reference_token_logprobs, strict=True))
    assert all(m >= 0 for m in answer.token_margins)  # greedy: the picked token is the top one


def test_every_answer_with_citations_carries_its_support_and_abstain_withholds(monkeypatch, loaded, planted_answer):
    """With a support model for the model (here one fitted on synthetic rows; the shipped ones are measured in
    docs/results/support), every answer carries its support; abstain withholds those under the threshold."""
    from midlens.generators.answering import generator as generator_module
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.support import ABSTAIN_TEXT, SupportModel
    from midlens.rag.pipeline import Pipeline

    fitted = SupportModel.fit(_rows(), verified=False, name="synthetic")
    # The model's own threshold is never below 0.5 (LIKELY_FLOOR) in force: abstain_below=0.0 keeps every answer.
    for threshold, withheld in ((1.01, True), (0.0, False)):
        model = SupportModel(**{**fitted.__dict__, "threshold": threshold})
        monkeypatch.setattr(generator_module, "packaged_support", lambda *_a, model=model: model)
        gen = Generator(loaded, method="baseline")
        pipe = Pipeline(None, gen, max_new_tokens=20, abstain=True, abstain_below=None if withheld else 0.0)
        question = "What is the secret code word of the Zorbland expedition?"
        answer = pipe.answer(question, planted_passages(5, 2))
        assert answer.support is not None and (answer.withheld is not None) is withheld
        assert not (withheld and answer.support.likely)  # the words agree with the withholding
        if withheld:
            assert answer.text == ABSTAIN_TEXT and answer.citations == []
            assert "pelican" in answer.withheld["text"].lower() and answer.withheld["citations"]
        else:
            assert "pelican" in answer.text.lower() and answer.withheld is None
        record = answer.to_dict()
        assert record["support"]["probability"] == answer.support.probability and record["support"]["words"]
    # Citations off: nothing to read a support from, and nothing withheld.
    plain = Pipeline(None, Generator(loaded, method="baseline", citations=None), max_new_tokens=8, abstain=True)
    answer = plain.answer("What is the secret code word?", planted_passages(5, 2))
    assert answer.support is None and answer.withheld is None and PLANTED_FACT


def test_verification_rescores_the_support_with_the_drops(monkeypatch, loaded):
    from midlens.generators.answering import generator as generator_module
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.support import SupportModel
    from midlens.rag.pipeline import Pipeline

    models = {v: SupportModel.fit(_rows(), verified=v, name="synthetic") for v in (False, True)}
    monkeypatch.setattr(generator_module, "packaged_support", lambda _name, _sha, verified, _method: models[verified])
    pipe = Pipeline(None, Generator(loaded, method="baseline"), max_new_tokens=8)
    question = "What is the secret code word of the Zorbland expedition?"
    answer = pipe.answer(question, planted_passages(5, 2))
    assert answer.support is not None and not answer.support.verified
    checked = pipe.answer(question, planted_passages(5, 2), verify=True)
    assert checked.support is not None and checked.support.verified and checked.text == answer.text


RIGHT = (
    "Which man, Ibn Tufail or Ali Qushji, is best known for the development of astronomical physics independent "
    "from natural philosophy?"
)
WRONG = 'The song "Judgment Night" was a collaboration between Onyx and the heavy metal band formed in which city?'


def test_the_default_flags_a_wrong_answer_and_not_a_right_one(loaded):
    """SmolLM2's answering default as `midlens ask` runs it (the baseline since the default rule judges systems as
    they ship; dense+links retrieval, top 5, in the order retrieved; its shipped support model, fitted on the
    baseline's, the fine-tune's and ms-poe's train answers) on two embedded questions: the right answer is not flagged
    (uncertain), the wrong one is flagged and, asked to abstain, withheld. fp32 here: 0.274 and 0.183 against a
    threshold of 0.656 (the fine-tune's short answers scored 0.598 and 0.021: the baseline's sentences sit nearer the
    0.2 edge, 0.07 above and 0.017 below it; the tolerances are bf16-vs-fp32 rounding and refits of the same rows)."""
    from midlens.eval.metrics import best_subspan_em
    from midlens.generators.answering.support import ABSTAIN_TEXT, UNLIKELY_BELOW
    from midlens.rag.pipeline import Pipeline

    pipe = Pipeline.from_corpus(model=loaded)
    right, wrong = pipe.ask(RIGHT), pipe.ask(WRONG, abstain=True)
    assert best_subspan_em(right.text, ["Ali Qushji"]) == 1.0 and right.support.band == "uncertain"
    assert right.support.probability == pytest.approx(0.274, abs=0.02) and right.support.model == "smollm2-135m"
    assert right.support.calibrated and right.support.threshold == pytest.approx(0.656, abs=0.001)
    assert wrong.support.band == "unlikely" and wrong.support.probability == pytest.approx(0.183, abs=0.01)
    assert wrong.support.probability < UNLIKELY_BELOW < right.support.probability
    assert wrong.text == ABSTAIN_TEXT and "Ashwood" in wrong.withheld["text"]  # a made-up city


def test_the_support_words_never_contradict_the_number_or_the_withholding():
    """Issue 74: "likely supported (0.49)" under the default model's 0.451 threshold, and "likely" on an answer an
    `abstain_below` of 0.8 withheld. "Likely" now needs 0.5 and the threshold in force (the model's, or the
    caller's abstain_below), which also decides the withholding; 0.2 up to it is "uncertain"."""
    from types import SimpleNamespace

    from midlens.generators.answering.support import ABSTAIN_TEXT, Support, SupportModel, abstain

    issue = Support.at(0.486, 0.4508, False, "qwen2.5-coder-0.5b")
    assert not issue.likely and issue.band == "uncertain" and not issue.words.startswith("likely")
    assert issue.words == (
        "uncertain: check it against the passages (0.49; likely from 0.50, the support model's threshold)"
    )
    assert Support.at(0.12, 0.5, False, "any").words.startswith("check this: the passages may not support it (0.12;")
    assert Support.at(0.93, 0.5, False, "any").to_dict()["band"] == "likely"

    fitted = SupportModel.fit(_rows(), verified=False, name="synthetic")
    low = SupportModel(**{**fitted.__dict__, "threshold": 0.3})
    for row in _rows():
        support = low.support(row["inputs"])
        assert support.threshold == 0.5 and support.likely is (support.probability >= 0.5)  # the floor in force

    def answered(p: float) -> SimpleNamespace:
        return SimpleNamespace(support=Support.at(p, 0.5, False, "any"), withheld=None, text="Red Bull", citations=[])

    for p, below, withheld, band in (
        (0.7, 0.8, True, "uncertain"),
        (0.4, 0.3, False, "uncertain"),
        (0.85, 0.8, False, "likely"),
        (0.45, None, True, "uncertain"),
    ):
        answer = answered(p)
        assert abstain(answer, below) is withheld and (answer.text == ABSTAIN_TEXT) is withheld
        assert answer.support.band == band and answer.support.threshold == (0.5 if below is None else below)
        assert not (withheld and answer.support.likely)  # never "likely" on a withheld answer


def _printed(words: str) -> tuple[float, float | None]:
    """The probability and where "likely" starts, as the words print them."""
    import re

    m = re.search(r"\((\d\.\d+)(?:; likely from (\d\.\d+),)?", words)
    return float(m.group(1)), None if m.group(2) is None else float(m.group(2))


def test_the_printed_probability_stays_in_its_band_and_the_words_name_the_threshold_in_force():
    """Issue 83 D: 0.196 printed "check this ... (0.20)" in the band below 0.2; a right answer read "uncertain (0.50)"
    under a threshold of 0.51 nobody saw; `abstain_below 0.3` turned "uncertain (0.51)" into "likely supported
    (0.51)" with nothing saying why. The number keeps the decimals its side of each edge needs, and the words say
    where "likely" starts and who set it."""
    from midlens.generators.answering.check import CheckedSupport
    from midlens.generators.answering.support import UNLIKELY_BELOW, Support, shown

    low = Support.at(0.196, 0.5, False, "smollm2-135m")
    assert low.band == "unlikely" and "(0.196; likely from 0.50," in low.words and "0.20" not in low.words
    checked = CheckedSupport(0.5049, False, 0.5098802133852476, False, "qwen2.5-coder-0.5b", (0.5049,))
    assert checked.words == (
        "uncertain: check it against the passages (0.50; likely from 0.51, the support model's threshold)"
    )
    close = Support.at(0.5096, 0.5098802133852476, False, "qwen2.5-coder-0.5b")
    assert "(0.5096; likely from 0.5099, the support model's threshold)" in close.words
    model = Support.at(0.51, 0.6562429139562045, False, "smollm2-135m")
    assert model.words.endswith("(0.51; likely from 0.66, the support model's threshold)")
    caller = model.under(0.3)
    assert caller.band == "likely" and caller.threshold_by == "abstain_below"
    assert caller.words == "likely supported (0.51; likely from 0.50, abstain_below 0.3 raised to the 0.5 floor)"
    assert model.under(0.8).words.endswith("(0.51; likely from 0.80, set by abstain_below)")
    assert checked.under(0.8).threshold_by == "abstain_below" and "set by abstain_below" in checked.under(0.8).words
    assert Support.from_dict(caller.to_dict()) == caller

    # Every probability on a grid, under thresholds that are and are not 2-decimal numbers: what is printed is on
    # the band's side of 0.2 and of where "likely" starts, as printed.
    for threshold in (0.5, 0.5098802133852476, 0.6562429139562045, 0.73):
        for i in range(1001):
            p = i / 1000 + (threshold - 0.5) / 7  # off the 2-decimal grid
            support = Support.at(p, threshold, False, "smollm2-135m")
            printed, likely_from = _printed(support.words)
            assert (printed >= UNLIKELY_BELOW) == (support.band != "unlikely"), support.words
            assert (printed >= likely_from) == (support.band == "likely"), support.words
            assert float(shown(p, UNLIKELY_BELOW)) >= UNLIKELY_BELOW or support.band == "unlikely"


def test_a_checked_sentence_below_the_edge_is_not_printed_at_it():
    """Issue 83 D, per sentence: "support 0.20, below 0.20" flagged a sentence at 0.196."""
    from midlens.generators.answering.check import CheckedSupport, flagged, support_lines
    from midlens.generators.answering.citations import Citation, CitedSource
    from tests.test_demo import fake_answer

    answer = fake_answer("Brea. It grew.", ["The first store opened in Brea.", "It grew."], [0.06, 0.02])
    source = CitedSource(1, "0", 0.9, (0, 31), None, None)
    answer.citations = [Citation((0, 5), (0, 2), [source]), Citation((6, 14), (2, 5), [source])]
    answer.support = CheckedSupport(0.196, False, 0.5576, False, "smollm2-135m", (0.7, 0.196))
    assert [why for _, why in flagged(answer)] == ["support 0.196, below 0.20"]
    assert support_lines(answer)[1] == "sentence support: 1. 0.70; 2. 0.196"


def test_an_answer_given_no_passages_says_so_instead_of_a_band():
    """Issue 83 E: an answer to a request with no passages (from the model's memory) read "check this: the
    passages may not support it (0.04)": nothing could support it, which the words now say, in a band of its own."""
    from midlens.generators.answering.support import NO_PASSAGES, Support, SupportModel

    fitted = SupportModel.fit(_rows(), verified=False, name="smollm2-135m")
    alone = fitted.support(inputs(text="Los Angeles", sources=[], evidence=()))
    assert alone.band == NO_PASSAGES and not alone.likely and not alone.passages_given
    assert alone.words == "no passages were given: nothing could support it"
    assert "no passages were given" in alone.plain() and "in 100" not in alone.plain()
    assert alone.under(0.0).words == alone.words and not alone.under(0.0).likely
    assert Support.from_dict(alone.to_dict()) == alone and alone.to_dict()["band"] == NO_PASSAGES
    assert fitted.support(inputs()).passages_given  # with passages, a band as before


def test_a_generated_answer_to_no_passages_says_none_were_given(loaded):
    """Issue 83 E with the real SmolLM2 and its shipped support model: a prompt without passages."""
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.support import NO_PASSAGES

    generator = Generator(loaded, method="baseline")
    answer = generator.generate(generator.prompt("What city is Hollywood in?", []), max_new_tokens=4)
    assert answer.text.strip() and not answer.passages and answer.support is not None
    assert answer.support.band == NO_PASSAGES and answer.support.words.startswith("no passages were given")


def test_the_words_name_the_model_agnostic_support_model_by_what_it_is():
    """Issue 83 N: "the support model any was fitted on ..." named the generic support model by its folder."""
    from midlens.generators.answering.support import GENERIC, Support

    methods = ("baseline", "mudaf(alpha=0)")
    generic = Support.at(0.29, 0.6, False, GENERIC, methods, "ms-poe")
    assert generic.words == (
        "uncertain: check it against the passages (0.29, not calibrated for ms-poe: the model-agnostic support "
        "model was fitted on answers of baseline, mudaf(alpha=0))"
    )
    own = Support.at(0.29, 0.6, False, "smollm2-135m", methods, "ms-poe")
    assert "smollm2-135m's support model was fitted on answers of" in own.words


ECHOED = "Which canal was built first, the Erie or the Suez?"


@pytest.mark.parametrize(
    ("answer", "restates"),
    [
        ("Question: Which canal was built first?", True),  # Gemma 3 270M's: the prompt's next question
        ("question: anything at all", True),
        ("Question:", True),
        ("Answer:", True),  # a bare cue line
        (" Answer: Question: Which canal was built first?", True),
        (ECHOED, True),
        (f"{ECHOED} Answer:", True),
        (f"The question is: {ECHOED.lower()}", True),
        # An answer drawn from the question's words is an answer: the question's text is not all there.
        ("The Erie.", False),
        ("The Erie canal was built first.", False),
        ("Erie or Suez", False),
        ("Answer: the Erie.", False),
        ("", False),  # says nothing: the empty answer's own words say so
    ],
)
def test_an_answer_that_restates_the_question_is_told_apart_from_one_drawn_from_its_words(answer, restates):
    """Issue 83 R: Gemma 3 270M answered "Question: Which canal was built ...?" and support rated it."""
    from midlens.core.answer_text import restates_question

    assert restates_question(answer, ECHOED) is restates


def test_an_answer_that_restates_the_question_is_not_rated():
    """Issue 83 R: no probability, no band of the support model, never likely, withheld when abstaining."""
    from midlens.generators.answering.check import CheckedSupport
    from midlens.generators.answering.support import BAND_WORDS, NO_ANSWER, Support, SupportModel

    fitted = SupportModel.fit(_rows(), verified=False, name="smollm2-135m")
    echo = fitted.support(inputs()).no_answer()
    assert echo.band == NO_ANSWER and not echo.likely and not echo.answered
    assert echo.words == BAND_WORDS[NO_ANSWER] == "no answer: it restates the question, so there is nothing to rate"
    assert "restated the question" in echo.plain() and "in 100" not in echo.plain()
    assert echo.under(0.0).band == NO_ANSWER and not echo.under(0.0).likely
    assert Support.from_dict(echo.to_dict()) == echo and echo.to_dict()["band"] == NO_ANSWER
    checked = CheckedSupport(0.9, True, 0.5, False, "smollm2-135m", (0.9,)).no_answer()
    assert isinstance(checked, CheckedSupport) and checked.band == NO_ANSWER and not checked.under(0.0).likely


def test_a_restated_question_is_no_answer_end_to_end(generator, planted_answer, capsys):
    """Issue 83 R with the real SmolLM2 and its shipped support models: a checked answer that is the prompt's next
    question, and a generated one whose text is the question, are not rated; the shell and the demo say there is
    no answer, and abstaining withholds it."""
    import copy

    from midlens.cli.ask import print_answer
    from midlens.demo import views
    from midlens.generators.answering.support import NO_ANSWER, abstain

    prompt, answer = planted_answer
    assert answer.support is not None and answer.support.answered  # a real answer is rated as before
    checked = generator.attribute(prompt, f"Question: {prompt.question}")
    assert checked.support is not None and checked.support.band == NO_ANSWER and not checked.support.likely

    echo = copy.copy(answer)
    echo.text, echo.citations = prompt.question, []  # the question in place of what the model wrote
    echo.support = generator.support_of(echo)
    assert echo.support.band == NO_ANSWER and not echo.support.likely
    print_answer(echo)
    line = next(li for li in capsys.readouterr().out.splitlines() if li.strip().startswith("support:"))
    assert line.strip() == "support: no answer: it restates the question, so there is nothing to rate"
    assert views.trust(echo, "calibrated").text.startswith("⚠ **No answer:** the model restated the question")
    assert abstain(echo) and echo.withheld["text"] == prompt.question


def test_the_bands_held_out_precision_is_what_the_committed_rows_give():
    """docs/results/support/bands.json (what README and the guide quote) recomputed from the committed rows, and
    the bands ordered as their words say on held-out answers: likely above uncertain above check this."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "docs" / "results" / "support" / "bands.py"
    spec = importlib.util.spec_from_file_location("bands", path)
    bands = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bands)
    result = bands.table()
    assert result == json.loads((path.parent / "bands.json").read_text())
    for model in result.values():
        held = model["held-out"]
        assert held["likely"]["right"] > held["uncertain"]["right"] > held["unlikely"]["right"]
        assert held["unlikely"]["right"] <= 0.15 and 0.3 <= held["uncertain"]["right"] <= 0.5
