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
    VERIFY_FEATURES,
    CheckedSupportModel,
    new_words,
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
        "question": "Which cities are where?",
        "passages": [*cited, "Rome is in Italy."],
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
    assert set(first) == set(CHECKED_FEATURES + VERIFY_FEATURES)
    # The words each sentence adds to the question: "Spain" is in no passage, Paris, Berlin and France are.
    assert first["new_words_in_passages"] == 1.0 and second["new_words_in_passages"] == pytest.approx(1 / 2)
    assert second["new_words_in_cited_passage"] == pytest.approx(1 / 2)
    assert first["cited_drop"] == 0.0 and first["cited_verified"] == 0.0  # not verified: no ablation read


def test_new_words_are_the_content_words_an_answer_adds_to_the_question():
    assert new_words("The answer is Paris.", "What is the capital of France?") == {"paris"}
    assert new_words("Paris is the capital of France.", "What is the capital of France?") == {"paris"}
    assert new_words("It is the capital.", "What is the capital of France?") == set()


def test_rows_checked_before_the_question_and_passages_were_recorded_are_refused_by_name():
    old = two_sentences([-0.1, -0.2, -0.3])
    del old["passages"]
    with pytest.raises(InvalidArgumentError, match="check the answers again"):
        sentence_features(old, 0)


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
    with pytest.raises(ArtefactError, match=r"features \['renamed'\] are not among this midlens's"):
        CheckedSupportModel.load(tmp_path / "other", METHOD_CHECKED, "abc")
    # One fitted on fewer of them reads each by name: the same probabilities after a round trip.
    fewer = CheckedSupportModel.fit_checked(rows(), "smollm2-135m", features=CHECKED_FEATURES[:5])
    fewer.save(tmp_path / "fewer", {**meta, "training": {}, "data": {}})
    reloaded, _ = CheckedSupportModel.load(tmp_path / "fewer", METHOD_CHECKED, "abc")
    assert reloaded.features == CHECKED_FEATURES[:5]
    assert reloaded.sentence_probabilities(bad) == pytest.approx(fewer.sentence_probabilities(bad), abs=1e-12)


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


def test_a_sentence_answer_states_the_answer_as_the_question_asks_or_in_an_answer_frame():
    from midlens.eval.check_support import FRAMES, sentence_answer, statement

    assert statement("Who wrote Hamlet?", "Shakespeare") == "Shakespeare wrote Hamlet."
    assert statement("what is the capital of France?", "Paris") == "The capital of France is Paris."
    assert statement("When did the war end?", "1945") is None  # no statement of that form: a frame instead
    frames = {f.format(a="1945") for f in FRAMES}
    made = {sentence_answer("When did the war end?", "1945", random.Random(seed)) for seed in range(30)}
    assert made <= frames and len(made) > 1
    both = {sentence_answer("Who wrote Hamlet?", "Shakespeare", random.Random(seed)) for seed in range(30)}
    assert "Shakespeare wrote Hamlet." in both and both - {"Shakespeare wrote Hamlet."}


def test_a_clause_answer_keeps_the_gold_answer_and_adds_a_distractor_entity_the_gold_passage_lacks():
    from midlens.eval.check_support import clause_answer

    ex = example()
    for seed in range(10):
        text = clause_answer(ex, random.Random(seed))
        assert "Ada Lovelace" in text and text.endswith(".")
        added = [e for e in ("Maida Vale", "Cambridge", "Navy", "Harvard", "Alan Turing", "Grace Hopper") if e in text]
        assert added and all(e not in ex.gold.text for e in added)


def test_a_check_run_plans_short_and_sentence_answers_of_each_question_without_a_model(tmp_path):
    from midlens.eval.check_support import TRAIN_KINDS, CheckRunOptions, plan

    config, units, sets = plan(CheckRunOptions(tmp_path, dataset="kv", split="train", n=3, kinds=TRAIN_KINDS[1:]))
    kinds = [u["kind"] for u in units]
    assert config["reader_method"] == "baseline" and config["kinds"] == list(TRAIN_KINDS[1:])
    assert kinds.count("gold-sentence") == 3 and kinds.count("wrong-sentence") == 3 and kinds.count("clause") == 3
    for u in units:
        gold = sets[0][u["example"]].answers[0]
        assert (gold in u["answer"]) == (u["kind"] in ("gold", "gold-sentence", "clause"))
        assert u["em"] == float(u["kind"] in ("gold", "gold-sentence"))  # a clause adds an unsupported claim
    with pytest.raises(InvalidArgumentError, match="kinds \\['invented'\\]"):
        plan(CheckRunOptions(tmp_path, dataset="kv", split="eval", n=3, kinds=("invented",)))
    with pytest.raises(InvalidArgumentError, match="'sweep' and --answers go together"):
        plan(CheckRunOptions(tmp_path, dataset="kv", split="eval", n=3, kinds=("sweep",)))


def test_a_sweeps_answers_are_checked_over_the_prompts_they_were_written_on_and_a_changed_dataset_is_refused(
    tmp_path,
):
    """A committed SQuAD sweep (SmolLM2, `litm`): its examples are rebuilt and verified by the recorded hash."""
    import json
    import shutil
    from pathlib import Path

    from midlens.eval.check_support import CheckRunOptions, plan

    sweep = Path(__file__).resolve().parent.parent / "docs" / "results" / "squad" / "smollm2-n30"
    options = CheckRunOptions(tmp_path / "out", dataset="kv", n=1, kinds=("sweep",), answers=(sweep,), answers_n=2)
    config, units, sets = plan(options)
    assert [u["position"] for u in units] == [1, 5, 10, 1, 5, 10] and {u["k"] for u in units} == {10}
    assert config["answers"][0]["data_sha256"] == json.loads((sweep / "config.json").read_text())["data_sha256"]
    rows = {}
    import gzip

    for line in gzip.open(sweep / "results.jsonl.gz", "rt"):
        row = json.loads(line)
        rows[(row["example_id"], row["position"], row["method"])] = row
    for u in units:
        example = sets[u["set"]][u["example"]]
        written = rows[(example.id, u["position"], "baseline")]
        assert u["answer"] == written["prediction"] and u["em"] == written["em"] and u["source"].endswith(":baseline")
    changed = tmp_path / "changed"
    shutil.copytree(sweep, changed)
    bad = {**json.loads((sweep / "config.json").read_text()), "data_sha256": "0" * 64}
    (changed / "config.json").write_text(json.dumps(bad))
    with pytest.raises(InvalidArgumentError, match="do not hash to its recorded data_sha256"):
        plan(replace(options, answers=(changed,)))


def test_an_added_answer_holds_a_right_sentence_and_one_unsupported_sentence_in_either_order():
    from midlens.eval.check_support import added_answer, sentence_labels

    ex = example()
    seen_first = set()
    for seed in range(12):
        text, planted, spans = added_answer(ex, random.Random(seed))
        assert len(spans) == 2 and tuple(planted) in spans
        wrong = text[planted[0] : planted[1]]
        right = next(text[a:b] for a, b in spans if (a, b) != tuple(planted))
        assert "Ada Lovelace" in right and "Ada Lovelace" not in wrong
        assert any(e in wrong for e in ("Maida Vale", "Cambridge", "Navy", "Harvard", "Alan Turing", "Grace Hopper"))
        seen_first.add(spans.index(tuple(planted)))
        unit = {"kind": "added", "em": 0.0, "planted": list(planted)}
        labels = sentence_labels({"sentence_spans": [list(s) for s in spans]}, unit)
        assert labels == [int(s != tuple(planted)) for s in spans]
    assert seen_first == {0, 1}  # the position of the false sentence is no cue


def test_a_reading_by_another_method_than_the_train_rows_is_shown_but_never_likely():
    model = CheckedSupportModel.fit_checked(rows(), "smollm2-135m", methods=("baseline",))
    good = two_sentences([-0.1, -0.3, -0.2])
    assert model.support(good, "baseline").likely and model.support(good).likely
    other = model.support(good, "mudaf(alpha=0)")
    assert other.probability == model.support(good, "baseline").probability
    assert not other.likely and not other.calibrated and not other.under(0.01).likely
    assert tuple(other.to_dict()["methods"]) == ("baseline",) and other.to_dict()["method"] == "mudaf(alpha=0)"


def test_a_sweep_over_a_file_needs_that_file_to_rebuild_its_prompts(tmp_path):
    from pathlib import Path

    from midlens.eval.check_support import CheckRunOptions, plan

    sweep = Path(__file__).resolve().parent.parent / "docs" / "results" / "as-shipped" / "smollm2-135m" / "nq-open"
    options = CheckRunOptions(tmp_path, dataset="kv", n=1, kinds=("sweep",), answers=(sweep,), answers_n=1)
    with pytest.raises(InvalidArgumentError, match="the sweep read nq-open-mdqa-10.jsonl.gz, a file: pass its path"):
        plan(options)
