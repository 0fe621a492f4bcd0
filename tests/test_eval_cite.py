"""`midlens eval cite`: citation metrics on a hand-made example, and the mode end to end on SmolLM2-135M (two
questions, short answers): resumable, every unit once, and its report section renders."""

from __future__ import annotations

import json

import pytest

from midlens.cli import main
from midlens.eval.cite import DEFAULT_RULE, apply_rule, cited_sets, gold_sets, lasso, parse_markers, prf, strip_markers
from midlens.eval.runner import read_rows


def _row() -> dict:
    """Three passages; supporting paragraphs at positions 1 and 3 (sentences 1#0, 3#0, 3#2)."""
    return {
        "em": 1.0,
        "gold_positions": [3, 1],
        "gold_sentences": ["1#0", "3#0", "3#2"],
        "first_sentence": ["1#0", "2@0", "3#0"],
        "evidence": [0.1, 0.5, 0.3],
        "sentences": [
            {
                "tokens": 4,
                "attention": [0.2, 0.3, 0.5],
                "attention_sentence": ["1#0", "2@10", "3#2"],
                "lexical": [0.0, 0.9, 0.1],
                "lexical_sentence": ["1@none", "2@0", "3#1"],
            }
        ],
        "prompted": {"em": 0.0, "cited": [2]},
    }


def test_precision_recall_f1_of_a_known_citation_set():
    assert prf({"a", "b"}, {"b", "c", "d"}) == pytest.approx({"precision": 0.5, "recall": 1 / 3, "f1": 0.4})
    assert prf(set(), {"a"}) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert prf({"a"}, {"a"}) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}


def test_the_rule_and_each_citer_on_a_hand_made_row():
    assert apply_rule([0.2, 0.3, 0.5], 2, 0.5) == [3, 2]
    assert apply_rule([0.2, 0.3, 0.5], 2, 0.7) == [3]
    assert apply_rule([0.0, 0.0], 2, 0.5) == []
    row = _row()
    gold_p, gold_s = gold_sets(row)
    assert gold_p == {"1", "3"}
    passages, sentences = cited_sets(row, "midlens", 2, 0.5)
    assert passages == {"3", "2"} and sentences == {"3#2", "2@10"}
    assert prf(passages, gold_p)["f1"] == pytest.approx(0.5)
    assert prf(sentences, gold_s) == pytest.approx({"precision": 0.5, "recall": 1 / 3, "f1": 0.4})
    assert cited_sets(row, "midlens", 3, 0.0)[0] == {"1", "2", "3"}
    assert cited_sets(row, "lexical", 2, 0.5) == ({"2"}, {"2@0"})
    assert cited_sets(row, "retrieval", 2, 0.5) == ({"1", "2"}, {"1#0", "2@0"})
    assert cited_sets(row, "evidence", 2, 0.5) == ({"2", "3"}, {"2@0", "3#0"})
    assert cited_sets(row, "prompted", 2, 0.5) == ({"2"}, None)
    # The evidence blended in as the library blends it (core.citation_rule): evidence shares 1/9, 5/9, 3/9 put
    # passage 2 first; each passage's sentence is still the one the answer attended most.
    assert cited_sets(row, "midlens", 1, 0.5, evidence_weight=1.0) == ({"2"}, {"2@10"})
    assert cited_sets(row, "midlens", 2, 0.7, evidence_weight=0.5) == ({"2", "3"}, {"2@10", "3#2"})
    assert cited_sets(row, "lexical", 2, 0.5, evidence_weight=1.0) == ({"2"}, {"2@0"})  # BM25's alone


def test_the_report_applies_the_rule_json_and_its_grid_covers_the_evidence_weight():
    from midlens.eval.report.cite import best_rule, rule_grid, unit_scores

    row = {**_row(), "position": 1}
    # 2 / 0.7 / weight 1 cites passage 2 only (F1 0); a rule.json from before the weight reads as weight 0.
    assert unit_scores(row, "midlens", {"max_sources": 2, "min_share": 0.7, "evidence_weight": 1.0})["passage"][
        "f1"
    ] == pytest.approx(0.0)
    assert unit_scores(row, "midlens", {"max_sources": 2, "min_share": 0.5})["passage"]["f1"] == pytest.approx(0.5)
    grid = rule_grid([row])
    assert {w for w, _, _ in grid} == {0.0, 0.25, 0.5, 0.75, 1.0}
    assert {w for w, _, _ in rule_grid([row], "lexical")} == {0.0}
    w, m, s = best_rule(grid)
    assert grid[(w, m, s)] == max(grid.values()) and m == 3  # only three sources reach passage 1 here


def test_a_rule_can_blend_in_the_raw_evidence_beside_the_calibrated():
    from midlens.core.errors import MidlensError
    from midlens.eval.report.cite import has_raw_evidence, rule_grid, unit_scores

    # Raw evidence puts passage 1 first where calibrated puts passage 2 first (a content-free query attends passage
    # 1 most, so calibration takes most of it away).
    row = {**_row(), "position": 1, "evidence_raw": [0.6, 0.3, 0.1]}
    assert cited_sets(row, "midlens", 1, 0.5, evidence_weight=1.0) == ({"2"}, {"2@10"})
    assert cited_sets(row, "midlens", 1, 0.5, raw_evidence_weight=1.0) == ({"1"}, {"1#0"})
    # Half and half: shares calibrated 1/9, 5/9, 3/9 and raw 6/10, 3/10, 1/10 average to passage 2 (0.43) first,
    # passage 1 (0.36) second.
    assert cited_sets(row, "midlens", 2, 0.0, 0.5, 0.5)[0] == {"2", "1"}
    assert cited_sets(row, "evidence_raw", 2, 0.5) == ({"1", "2"}, {"1#0", "2@0"})
    raw_rule = {"max_sources": 1, "min_share": 0.5, "evidence_weight": 0.0, "raw_evidence_weight": 1.0}
    assert unit_scores(row, "midlens", raw_rule)["passage"]["f1"] == pytest.approx(2 / 3)
    assert rule_grid([row], raw_evidence_weight=1.0)[(0.0, 1, 0.5)] == pytest.approx(2 / 3)
    assert {w for w, _, _ in rule_grid([row], raw_evidence_weight=0.5)} == {0.0, 0.25, 0.5}  # weights sum to 1
    assert rule_grid([row])[(1.0, 1, 0.5)] == pytest.approx(0.0)
    assert has_raw_evidence([row]) and not has_raw_evidence([_row()])
    # Another method's evidence (`--cite-evidence`): the rule blends it in instead of the row's own, and it is a
    # citer of its own (its raw evidence, top passages); a run without it has no such citer.
    scored = {**row, "evidence_from": {"evidence": [0.0, 0.1, 0.9], "evidence_raw": [0.1, 0.2, 0.7]}}
    assert cited_sets(scored, "midlens", 1, 0.5, evidence_weight=1.0) == ({"3"}, {"3#2"})
    assert cited_sets(scored, "midlens", 1, 0.5, raw_evidence_weight=1.0) == ({"3"}, {"3#2"})
    assert cited_sets(scored, "evidence_from", 2, 0.5) == ({"3", "2"}, {"3#0", "2@0"})
    assert cited_sets(scored, "evidence", 1, 0.5) == cited_sets(row, "evidence", 1, 0.5)  # still the row's own
    assert unit_scores(row, "evidence_from", DEFAULT_RULE) is None
    # A run from before rows kept raw evidence: its raw citer did not run, and a raw rule says why it cannot grade it.
    assert unit_scores(_row(), "evidence_raw", DEFAULT_RULE) is None
    with pytest.raises(MidlensError, match="no raw evidence: its run predates"):
        unit_scores(_row(), "midlens", raw_rule)
    with pytest.raises(ValueError, match="exceed 1"):
        cited_sets(row, "midlens", 1, 0.5, evidence_weight=0.75, raw_evidence_weight=0.5)


def test_markers_and_the_sparse_fit():
    assert parse_markers("Paris [2][5]. Also [2] and [11] [0].", 10) == [2, 5]
    assert strip_markers("Paris [2][5].") == "Paris ."
    masks = [[(i >> j) & 1 for j in range(3)] for i in range(8)]
    weights, intercept = lasso(masks, [3.0 * m[1] + 0.5 * m[2] - 1 for m in masks], alpha=1e-4)
    assert weights == pytest.approx([0.0, 3.0, 0.5], abs=1e-2) and intercept == pytest.approx(-1, abs=1e-2)


@pytest.mark.model
def test_cite_runs_end_to_end_resumes_and_reports(tmp_path):
    out = tmp_path / "cite"
    args = ["eval", "cite", "--n", "2", "--positions", "1", "--max-words", "20", "--max-new-tokens", "4"]
    args += ["--split", "train", "--drops", "1", "--ablations", "2", "--no-progress", "--out", str(out)]
    assert main([*args, "--n", "1"]) == 0  # the last --n wins: a run on the first question
    assert len(read_rows(out / "results.jsonl")) == 1
    assert main(args) == 0  # grows to two questions: the second one's unit only
    assert json.loads((out / "config.json").read_text())["extended"] == [1]
    rows = read_rows(out / "results.jsonl")
    assert sorted(r["key"] for r in rows) == sorted({r["key"] for r in rows}) and len(rows) == 2
    for row in rows:
        assert len(row["first_sentence"]) == len(row["evidence"]) == len(row["evidence_raw"]) >= 2
        assert set(row["drops"]) >= {"midlens", "lexical", "retrieval", "random", "contextcite"}
        assert "cited" in row["prompted"]
        # the generated ids are kept, so a later verification scores what was generated, not a re-tokenisation
        assert len(row["answer_ids"]) == row["answer_tokens"] == sum(s["tokens"] for s in row["sentences"])
        for sentence in row["sentences"]:
            assert sum(sentence["attention"]) == pytest.approx(1.0, abs=1e-4)
    assert main(args) == 0  # nothing left: no unit twice
    assert len(read_rows(out / "results.jsonl")) == 2
    config = json.loads((out / "config.json").read_text())
    assert config["kind"] == "cite" and "rule" not in config  # a report-time choice: rule.json
    assert json.loads((out / "rule.json").read_text()) == DEFAULT_RULE
    assert main(["eval", "report", str(out)]) == 0
    report = (out / "report.md").read_text()
    assert "## Citations: hotpotqa-train" in report and "Passage-level citations, all answers" in report
    assert "| midlens |" in report and "top-1 drop" in report
    assert "Rule grid, midlens, raw_evidence_weight=0.5" in report and "| evidence_raw |" in report


@pytest.mark.model
def test_cite_shards_split_the_questions_and_merge_into_one_run(tmp_path):
    out = tmp_path / "cite"
    args = ["eval", "cite", "--n", "2", "--positions", "1", "--max-words", "20", "--max-new-tokens", "4"]
    args += ["--split", "train", "--no-prompted", "--no-progress", "--out", str(out)]
    assert main([*args, "--shard", "1/2"]) == 0
    assert not (out / "results.jsonl").exists()
    shard = read_rows(out / "results.shard-1-of-2.jsonl")
    assert [r["example"] for r in shard] == [1]  # every 2nd question from the 2nd: the second alone
    assert main([*args, "--shard", "0/2"]) == 0
    assert main(["eval", "merge", str(out), "--out", str(out)]) == 0
    assert sorted(r["example"] for r in read_rows(out / "results.jsonl")) == [0, 1]
    assert main([*args, "--shard", "2/2"]) == 2  # no such shard: refused, nothing written
    assert sorted(p.name for p in out.glob("results*.jsonl")) == [
        "results.jsonl",
        "results.shard-0-of-2.jsonl",
        "results.shard-1-of-2.jsonl",
    ]


@pytest.mark.model  # it loads SmolLM2-135M itself (no fixture marks it): out of `make test-fast`
def test_cite_cost_times_each_variant_and_the_first_streamed_delta():
    """One alternating measurement, in this process: the four timed variants on one prompt; a stream's first
    delta comes before its answer is done."""
    import torch

    from midlens.eval.cite_cost import TIMED, child

    # child() is a measuring process's body: it sets torch's thread count, which must not outlive this test.
    threads = torch.get_num_threads()
    try:
        out = child("alternate", "smollm2-135m", 1, 1, 20, 6)
        scored = child("alternate", "smollm2-135m", 1, 1, 20, 6, evidence_from="mudaf")
    finally:
        torch.set_num_threads(threads)
    assert set(out["times"]) == set(TIMED) and all(len(t) == 1 and t[0] > 0 for t in out["times"].values())
    for variant, firsts in out["first_delta"].items():
        assert 0 < firsts[0] <= out["times"][variant][0]
    assert out["stream_ratio"] > 0 and out["first_delta_ratio"] > 0
    assert out["cite_evidence_s"] == [0.0]  # citations read the answering pass's own evidence: no scorer ran
    assert len(scored["cite_evidence_s"]) == 1 and 0 < scored["cite_evidence_s"][0] < scored["times"]["cite"][0]


def test_a_run_grades_the_rule_the_library_cites_by_for_its_model_and_method(tmp_path):
    """Without rule flags, rule.json is the rule `Generator` applies: the one measured for (model, method) where all
    the run's methods share it, the default otherwise; each flag given wins over it."""
    from midlens.eval.cite import CiteOptions, run_rule
    from midlens.generators.answering.citations import MEASURED_RULES

    measured = {**DEFAULT_RULE, **MEASURED_RULES[("qwen2.5-coder-0.5b", "mudaf")]}
    assert measured != DEFAULT_RULE
    qwen = CiteOptions(tmp_path, model="qwen2.5-coder-0.5b")
    assert run_rule(qwen, ["mudaf"]) == measured
    with pytest.warns(DeprecationWarning):  # the old name too
        assert run_rule(CiteOptions(tmp_path, model="qwen2.5-0.5b"), ["mudaf"]) == measured
    assert run_rule(qwen, ["baseline", "mudaf"]) == DEFAULT_RULE  # one rule per run: theirs differ
    assert run_rule(CiteOptions(tmp_path, model="smollm2-135m"), ["mudaf"]) == {**DEFAULT_RULE, "min_share": 0.5}
    assert run_rule(CiteOptions(tmp_path, model="smollm2-135m"), ["baseline"]) == DEFAULT_RULE
    given = CiteOptions(tmp_path, model="qwen2.5-coder-0.5b", max_sources=4)
    assert run_rule(given, ["mudaf"]) == {**measured, "max_sources": 4}


@pytest.mark.model
def test_a_run_with_another_methods_evidence_grades_what_the_library_cites(tmp_path, loaded):
    """`--cite-evidence mudaf`: each row keeps MuDAF's evidence of its prompt beside the answering pass's own, the
    rule measured with it is the run's, and the passages the report grades are the ones
    `Generator(citations=MeasuredCitations(evidence_from="mudaf"))` cites on the same prompt."""
    from midlens.eval.cite import layout, rule_scores
    from midlens.eval.datasets import load_hotpotqa
    from midlens.generators import Generator
    from midlens.generators.answering.citations import CitationConfig, MeasuredCitations

    out = tmp_path / "cite"
    args = ["eval", "cite", "--n", "1", "--positions", "1", "--max-words", "20", "--max-new-tokens", "12"]
    args += ["--split", "train", "--no-prompted", "--drops", "1", "--no-progress", "--cite-evidence", "mudaf"]
    assert main([*args, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["cite_evidence"]["spec"] == "mudaf" and config["cite_evidence"]["name"] == "mudaf"
    measured = CitationConfig.measured("smollm2-135m", "baseline", "mudaf")
    rule = json.loads((out / "rule.json").read_text())
    assert rule == {k: getattr(measured, k) for k in DEFAULT_RULE}
    (row,) = read_rows(out / "results.jsonl")
    k = len(row["evidence"])
    assert len(row["evidence_from"]["evidence"]) == len(row["evidence_from"]["evidence_raw"]) == k
    # MuDAF's delta reads the prompt differently: were these the answering pass's own scores, nothing was blended.
    assert (
        max(abs(a - b) for a, b in zip(row["evidence_from"]["evidence_raw"], row["evidence_raw"], strict=True)) > 1e-4
    )
    assert set(row["drops"]) >= {"cited", "evidence_from", "midlens", "evidence"}
    assert row["sentences"], "the answer has a sentence to cite"

    example = load_hotpotqa(1, 0, mode="cite", max_words=20, split="train")[0]
    gen = Generator(loaded, method="baseline", citations=MeasuredCitations(evidence_from="mudaf"))
    prompt = gen.prompt(example.question, layout(example, 1, 0), max_new_tokens=12)
    answer = gen.generate(prompt, max_new_tokens=12)
    assert answer.text == row["prediction"]
    library = [sorted(s.position for s in c.sources) for c in answer.citations]
    graded = [
        sorted(
            apply_rule(
                rule_scores(row, s, rule["evidence_weight"], rule["raw_evidence_weight"]),
                rule["max_sources"],
                rule["min_share"],
            )
        )
        for s in row["sentences"]
    ]
    assert library == graded
    assert main(["eval", "report", str(out)]) == 0
    assert "the evidence blended in is mudaf's" in (out / "report.md").read_text()

    assert main([*args[:-1], "no-such-method", "--out", str(tmp_path / "bad")]) == 2  # refused before loading
    assert not (tmp_path / "bad").exists()
