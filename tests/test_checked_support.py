"""The checked support model (generators.answering.check) and the rows it is fitted on (eval.check_support), without a
language model: per-sentence features, fitting, saving and loading, and the wrong and planted answers made to check."""

import random
from dataclasses import replace

import pytest

from midlens.core.errors import ArtefactError, InvalidArgumentError
from midlens.core.passage import Passage
from midlens.eval.datasets import Example
from midlens.generators.answering.check import (
    CHECKED_FEATURES,
    METHOD_CHECKED,
    CheckedSupportModel,
    sentence_features,
)


def inputs(text: str, logprobs: list[float], sentences: list[tuple[int, int, int, int]], cited: list[str]) -> dict:
    """Checked inputs of `text`: `sentences` as (first token, end token, first char, end char), each citing (rank 0,
    share 0.6 over a second source's 0.2) a passage whose text is the matching entry of `cited`."""
    sources = []
    for i, passage in enumerate(cited):
        sources.append(
            {"sentence_index": i, "rank": 0, "position": 1, "share": 0.6, "sentence": passage, "passage": passage}
        )
        sources.append({"sentence_index": i, "rank": 1, "position": 2, "share": 0.2, "sentence": "x", "passage": "x"})
    return {
        "text": text,
        "token_logprobs": logprobs,
        "token_margins": [1.0] * len(logprobs),
        "sentences": len(sentences),
        "sources": sources,
        "evidence": [0.3, 0.1, 0.1],
        "attribution": [None, None, None],
        "sentence_tokens": [[a, b] for a, b, _, _ in sentences],
        "sentence_spans": [[c, d] for _, _, c, d in sentences],
    }


TEXT = "Paris is in France. Berlin is in Spain."


def two_sentences(second_logprobs: list[float]) -> dict:
    return inputs(
        TEXT,
        [-0.1, -0.2, -0.1, *second_logprobs],
        [(0, 3, 0, 19), (3, 3 + len(second_logprobs), 20, len(TEXT))],
        ["Paris is in France.", "Berlin is in Germany."],
    )


def test_each_sentence_reads_only_its_own_tokens_words_and_citation():
    first, second = (sentence_features(two_sentences([-0.1, -6.0, -0.3]), i) for i in (0, 1))
    assert first["min_logprob"] == pytest.approx(-0.2) and second["min_logprob"] == pytest.approx(-6.0)
    assert first["mean_logprob"] == pytest.approx(-0.4 / 3) and second["first_logprob"] == pytest.approx(-0.1)
    # "Berlin is in Spain": 3 of its 4 words are in "Berlin is in Germany".
    assert first["words_in_cited_sentence"] == 1.0 and second["words_in_cited_sentence"] == pytest.approx(0.75)
    assert first["share_margin"] == pytest.approx(0.4) and first["cited_is_top_evidence"] == 1.0
    assert set(first) == set(CHECKED_FEATURES)


def rows(count: int = 40) -> list[dict]:
    """Train rows: a right answer's false second sentence has a far lower token log-probability."""
    rng = random.Random(0)
    out = []
    for i in range(count):
        bad = i % 2 == 0
        row_inputs = two_sentences([-0.1, rng.uniform(-9, -4) if bad else rng.uniform(-1, -0.1), -0.2])
        out.append({"inputs": row_inputs, "sentence_labels": [1, 0 if bad else 1], "em": 0.0 if bad else 1.0})
    return out


def test_the_fitted_model_scores_the_false_sentence_lowest_and_round_trips_as_an_artefact(tmp_path):
    model = CheckedSupportModel.fit_checked(rows(), "smollm2-135m")
    assert model.method == "support-checked" and not model.verified
    bad = two_sentences([-0.1, -7.0, -0.2])
    probabilities = model.sentence_probabilities(bad)
    assert probabilities[1] < 0.5 < probabilities[0]
    support = model.support(bad)
    assert support.probability == min(probabilities) and support.sentences == tuple(probabilities)
    assert support.to_dict()["checked"] and not support.likely
    good = model.support(two_sentences([-0.1, -0.3, -0.2]))
    assert good.probability > 0.5 and good.likely  # the threshold: 80 % precision on these separable rows
    meta = {"method": model.method, "base_model": "smollm2-135m", "base_model_sha256": "abc", "options": {}}
    model.save(tmp_path / "m", {**meta, "training": {}, "data": {}})
    loaded, _ = CheckedSupportModel.load(tmp_path / "m", METHOD_CHECKED, "abc")
    assert loaded.sentence_probabilities(bad) == pytest.approx(probabilities, abs=1e-12)
    assert loaded.threshold == model.threshold and loaded.name == "m"
    with pytest.raises(ArtefactError, match="not on the model loaded now"):
        CheckedSupportModel.load(tmp_path / "m", METHOD_CHECKED, "def")
    # A model saved over other features (an older midlens's) is refused by name, not read into the wrong slots.
    other = replace(model, features=(*model.features[:-1], "renamed"))
    other.save(tmp_path / "other", {**meta, "training": {}, "data": {}})
    with pytest.raises(ArtefactError, match="features .* are not this midlens's"):
        CheckedSupportModel.load(tmp_path / "other", METHOD_CHECKED, "abc")


def test_a_fit_on_one_label_is_refused():
    one_label = [{**r, "sentence_labels": [1, 1], "em": 1.0} for r in rows(4)]
    with pytest.raises(InvalidArgumentError, match="all of one label"):
        CheckedSupportModel.fit_checked(one_label, "smollm2-135m")


def example() -> Example:
    gold = Passage(
        text="Ada Lovelace was born in London in 1815. She worked with Charles Babbage on the Analytical Engine. "
        "Her notes held the first published algorithm.",
        title="Ada",
        id="g",
    )
    distractors = [
        Passage(text="Alan Turing was born in Maida Vale in 1912. He studied at Cambridge.", title="T", id="d1"),
        Passage(text="Grace Hopper joined the Navy in 1943 and worked at Harvard.", title="H", id="d2"),
    ]
    return Example("x", "Who worked with Babbage?", ["Ada Lovelace"], [gold, *distractors], ["g"])


def test_a_wrong_answer_is_a_distractor_entity_of_the_gold_answers_kind():
    from midlens.eval.check_support import distractor_entity

    ex = example()
    rng = random.Random(0)
    name = distractor_entity(ex, "Ada Lovelace", rng, avoid=ex.gold.text)
    assert name in {"Maida Vale", "Cambridge", "Navy", "Harvard"}  # names inside a distractor, not its first word
    assert distractor_entity(ex, "1815", rng, avoid=ex.gold.text) in {"1912", "1943"}
    assert distractor_entity(ex, "yes", rng) == "no"


def test_a_planted_answer_differs_from_the_gold_passage_in_one_entity_of_one_sentence():
    from midlens.eval.check_support import planted_answer

    ex = example()
    text, planted, spans = planted_answer(ex, random.Random(3))
    assert len(spans) == 3 and tuple(planted) in spans
    sentences = [text[a:b] for a, b in spans]
    changed = [s for s in sentences if s not in ex.gold.text]
    assert changed == [text[planted[0] : planted[1]]]
    distractor_text = " ".join(p.text for p in ex.distractors)
    assert any(word in distractor_text for word in changed[0].split() if word not in ex.gold.text)
