"""midlens eval: metrics on hand-worked cases, loaders, the sweep/rerank/e2e units with the real model,
resume after an interruption, shard + merge, and the report."""

from __future__ import annotations

import gzip
import json
import math
import re

import pytest

from midlens.core.errors import CorpusError
from midlens.core.passage import Passage
from midlens.eval.datasets import Example, kv_retrieval, load_hotpotqa, load_litm, load_questions, subsample_indices
from midlens.eval.metrics import answer_f1, best_subspan_em, mrr, ndcg_at_k, normalize_answer, recall_at_k, token_f1


def test_normalisation_and_first_line_rule():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert best_subspan_em("It is Paris.", ["paris"]) == 1.0
    assert best_subspan_em("Paris\nLondon", ["London"]) == 0.0  # only the first line counts
    assert best_subspan_em("\n\nLondon, England", ["the london"]) == 1.0  # leading blank lines skipped
    assert best_subspan_em("Lond", ["London"]) == 0.0


def test_f1_hand_worked():
    # pred {cat, sat} vs gold {cat, sat, down}: precision 1, recall 2/3 -> F1 0.8
    assert token_f1("the cat sat", "cat sat down") == pytest.approx(0.8)
    assert answer_f1("cat sat\ncat sat down", ["cat sat down", "dog"]) == pytest.approx(0.8)
    assert token_f1("", "") == 1.0 and token_f1("x", "") == 0.0


def test_ranking_metrics_hand_worked():
    ranked, gold = ["a", "b", "c", "d"], {"b", "d"}
    assert [recall_at_k(ranked, gold, k) for k in (1, 2, 5)] == [0.0, 0.5, 1.0]
    assert mrr(ranked, gold) == 0.5 and mrr(ranked, {"z"}) == 0.0
    ideal = 1 + 1 / math.log2(3)
    assert ndcg_at_k(ranked, gold) == pytest.approx((1 / math.log2(3) + 1 / math.log2(5)) / ideal)
    assert ndcg_at_k(["b", "d", "a"], gold) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        recall_at_k(ranked, set(), 1)


def test_subsampling_is_seeded_and_prefix_stable():
    assert subsample_indices(100, 10, 3) == subsample_indices(100, 10, 3)
    assert subsample_indices(100, 20, 3)[:10] == subsample_indices(100, 10, 3)
    assert subsample_indices(100, 10, 3) != subsample_indices(100, 10, 4)


def _litm_row(q, gold_text, answer="pelican"):
    ctxs = [
        {"title": "G", "text": gold_text, "hasanswer": True, "isgold": True},
        {"title": "D1", "text": "nothing here", "hasanswer": False, "isgold": False},
        {"title": "D2", "text": f"also {answer}", "hasanswer": True, "isgold": False},
        {"title": "D3", "text": "filler", "hasanswer": False, "isgold": False},
    ]
    return {"question": q, "answers": [answer], "ctxs": ctxs}


def test_litm_loader_plain_and_gzip_and_errors(tmp_path):
    rows = [_litm_row("q1?", "the word is pelican"), _litm_row("q2?", "the word is heron", "heron")]
    plain = tmp_path / "a.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.write(plain.read_text())
    for path in (plain, gz):
        examples = load_litm(path)
        assert sorted(e.question for e in examples) == ["q1?", "q2?"]
        ex = examples[0]
        assert ex.gold.title == "G"
        assert [p.title for p in ex.distractors] == ["D1", "D3"]  # a non-gold ctx with the answer is dropped
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + '{"question": "x", "answers": [], "ctxs": []}\n')
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: .*answers"):
        load_litm(bad)
    bad.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(CorpusError, match=r"bad\.jsonl:2: invalid JSON"):
        load_litm(bad)
    nogold = dict(rows[0], ctxs=[c | {"isgold": False} for c in rows[0]["ctxs"]])
    bad.write_text(json.dumps(nogold) + "\n")
    with pytest.raises(CorpusError, match="isgold"):
        load_litm(bad)


def test_questions_loader_names_file_and_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "a?", "answers": ["x"]}\n\n{"question": "", "answers": ["y"]}\n')
    with pytest.raises(CorpusError, match=r"q\.jsonl:3"):
        load_questions(path)
    path.write_text('{"question": "a?", "answers": ["x"], "gold_titles": "T"}\n')
    with pytest.raises(CorpusError, match="gold_titles"):
        load_questions(path)


def test_hotpotqa_mdqa_and_rerank_modes():
    examples = load_hotpotqa(30, seed=1, mode="mdqa", k=10)
    assert len(examples) == 30
    assert [e.id for e in examples] == [e.id for e in load_hotpotqa(30, seed=1, mode="mdqa", k=10)]
    for ex in examples:
        norm = normalize_answer(ex.answers[0])
        assert len(ex.gold_ids) == 1 and norm in normalize_answer(ex.gold.text)
        assert norm not in ("yes", "no") and norm not in normalize_answer(ex.question)
        assert len(ex.distractors) >= 9
        assert all(len(p.text.split()) < 250 for p in ex.distractors[:9])
    reranks = load_hotpotqa(5, seed=1, mode="rerank", max_words=None)
    assert all(len(e.gold_ids) == 2 and len(e.passages) == 10 for e in reranks)


def test_kv_retrieval_is_seeded():
    a, b = kv_retrieval(3, pairs=5, seed=7), kv_retrieval(3, pairs=5, seed=7)
    assert [e.passages for e in a] == [e.passages for e in b]
    ex = a[0]
    assert len(ex.passages) == 5 and ex.gold_ids[0] in ex.question and ex.answers[0] not in ex.question
    assert ex.answers[0] in ex.gold.text
    with pytest.raises(ValueError):
        kv_retrieval(1, pairs=1)


def test_layout_moves_the_gold():
    from midlens.eval.sweep import layout

    ex = kv_retrieval(1, pairs=5)[0]
    for pos in (1, 3, 5):
        passages = layout(ex, 5, pos)
        assert passages[pos - 1].id == ex.gold_ids[0] and len(passages) == 5
    with pytest.raises(ValueError, match="outside"):
        layout(ex, 5, 6)
    with pytest.raises(ValueError, match="K=6 needs 5. To fix it, pass k=5 or lower"):
        layout(ex, 6, 1)


def test_long_context_reorder_puts_best_passages_at_the_ends():
    from midlens.eval.sweep import dense_scores, long_context_reorder

    docs = [
        Passage("Bananas are a yellow fruit grown in the tropics.", "Banana", "b"),
        Passage("The Eiffel Tower is a wrought-iron tower in Paris.", "Eiffel Tower", "e"),
        Passage("Volcanoes erupt molten rock.", "Volcano", "v"),
        Passage("Paris is the capital of France; the Eiffel Tower stands there.", "Paris", "p"),
        Passage("Chess is a board game.", "Chess", "c"),
    ]
    question = "Where is the Eiffel Tower?"
    scores = dict(zip([d.id for d in docs], dense_scores(question, docs), strict=True))
    out = long_context_reorder(question, docs)
    assert sorted(p.id for p in out) == sorted(d.id for d in docs)
    best_two = sorted(scores, key=scores.get)[-2:]
    assert {out[0].id, out[-1].id} == set(best_two)
    assert min(scores, key=scores.get) == out[len(out) // 2].id


def _planted_example(n=4):
    from tests.conftest import planted_passages

    passages = planted_passages(n, gold_at=1)
    for p in passages:
        p.text = p.text[:200]
    return Example(
        "planted", "What is the secret code word of the Zorbland expedition?", ["pelican"], passages, ["gold"]
    )


def test_attention_sort_and_sweep_row(generator, loaded):
    from midlens.eval.sweep import PositionSweep, attention_sort
    from midlens.generators import Generator

    ex = _planted_example(4)
    scored = generator.score(generator.prompt(ex.question, ex.passages, max_new_tokens=4))
    key = {p.passage.id: p.calibrated for p in scored.passages}
    out = attention_sort(generator, ex.question, ex.passages, 4)
    assert [key[p.id] for p in out] == sorted(key.values())  # strongest evidence next to the question

    ms_poe = Generator(loaded, method="ms-poe")
    row = PositionSweep({"ms-poe": ms_poe}, k=4, max_new_tokens=4)(ex, 2, "ms-poe")
    assert row["gold_prompt_position"] == 2 and 1 <= row["gold_rank"] <= 4 and 1 <= row["gold_rank_raw"] <= 4
    assert 0 < row["gold_share"] < 1 and row["logprob"] < 0
    assert row["em"] == best_subspan_em(row["prediction"], ["pelican"])
    row = PositionSweep(
        {"attn-sort": generator}, k=4, max_new_tokens=4, logprob=False, orderings={"attn-sort": "attn-sort"}
    )(ex, 1, "attn-sort")
    assert (
        "logprob" not in row
        and row["gold_prompt_position"]
        == 5 - {v: i for i, v in enumerate(sorted(key.values(), reverse=True), 1)}[key["gold"]]
    )


def test_sweep_reuses_an_identical_prompt_and_the_reuse_is_exact(generator):
    """LongContextReorder sorts by retrieval score, so every gold position yields one prompt: answered once."""
    from midlens.eval.sweep import PositionSweep

    ex = _planted_example(4)
    sweep = PositionSweep({"lcr": generator}, k=4, max_new_tokens=4, orderings={"lcr": "lcr"})
    first, moved = sweep(ex, 1, "lcr"), sweep(ex, 3, "lcr")
    assert "reused_from_position" not in first and moved["reused_from_position"] == 1
    fresh = PositionSweep({"lcr": generator}, k=4, max_new_tokens=4, orderings={"lcr": "lcr"})(ex, 3, "lcr")
    volatile = {"seconds", "reused_from_position"}
    assert {k: v for k, v in moved.items() if k not in volatile} == {k: v for k, v in fresh.items() if k != "seconds"}
    baseline = PositionSweep({"baseline": generator}, k=4, max_new_tokens=4)
    assert "reused_from_position" not in baseline(ex, 1, "baseline") | baseline(ex, 3, "baseline")


def _sweep_args(out, *extra):
    return [
        "eval",
        "sweep",
        "--dataset",
        "kv",
        "--k",
        "3",
        "--n",
        "2",
        "--positions",
        "1,3",
        "--methods",
        "baseline",
        "--max-new-tokens",
        "4",
        "--no-progress",
        "--out",
        str(out),
        *extra,
    ]


def _stable(rows, *also):
    from midlens.eval.runner import VOLATILE

    drop = {*VOLATILE, *also}
    return [{k: v for k, v in r.items() if k not in drop} for r in sorted(rows, key=lambda r: r["order"])]


def test_resume_after_interruption_and_shard_merge_equal_one_run(tmp_path, loaded):
    from midlens.cli import main
    from midlens.eval.runner import RunError, read_rows

    assert main(_sweep_args(tmp_path / "full")) == 0
    full = read_rows(tmp_path / "full" / "results.jsonl")
    assert len(full) == 4 and {r["method"] for r in full} == {"baseline"}
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert config["model_sha256"] and config["data_sha256"] and config["device"] == "cpu"
    assert config["seed"] == 0 and config["methods_sha256"]["baseline"]

    # Interrupted: two units done, then killed while writing the third line.
    part = tmp_path / "part"
    assert main(_sweep_args(part, "--limit", "2")) == 0
    with (part / "results.jsonl").open("a") as f:
        f.write('{"key": "torn')
    assert main(_sweep_args(part)) == 0
    assert _stable(read_rows(part / "results.jsonl")) == _stable(full)

    shards = tmp_path / "shards"
    for i in (0, 1):
        assert main(_sweep_args(shards, "--shard", f"{i}/2")) == 0
    assert main(["eval", "merge", str(shards), "--out", str(tmp_path / "merged")]) == 0
    assert _stable(read_rows(tmp_path / "merged" / "results.jsonl")) == _stable(full)

    # A run on fewer questions grows to more: its rows stay, the new questions' rows join them, the growth is
    # recorded. It does not shrink, and it does not grow onto questions that are not its own first ones.
    grown = tmp_path / "grown"
    assert main(_sweep_args(grown, "--n", "1")) == 0
    first = read_rows(grown / "results.jsonl")
    assert len(first) == 2
    assert main(_sweep_args(grown)) == 0
    rows = read_rows(grown / "results.jsonl")
    # Each row keeps the hash of the config it was made under: the first ones that of the run on one question.
    assert rows[:2] == first and _stable(rows, "config_sha256") == _stable(full, "config_sha256")
    config = json.loads((grown / "config.json").read_text())
    assert config["examples"] == 2 and config["extended"] == [1]
    with pytest.raises(RunError, match="grows but does not shrink"):
        _run_cli(_sweep_args(grown, "--n", "1"))
    tampered = tmp_path / "tampered"
    assert main(_sweep_args(tampered, "--n", "1")) == 0
    config = json.loads((tampered / "config.json").read_text())
    (tampered / "config.json").write_text(json.dumps({**config, "data_sha256": "0" * 64}))  # its dataset changed
    with pytest.raises(RunError, match="not the first 1 of these 2"):
        _run_cli(_sweep_args(tampered))

    # A run as it ships (rows gzipped, docs/results/) resumes as it is: only its missing units run.
    shipped = tmp_path / "shipped"
    assert main(_sweep_args(shipped, "--limit", "2")) == 0
    data = (shipped / "results.jsonl").read_bytes()
    packed = gzip.compress(data, mtime=0)
    (shipped / "results.jsonl.gz").write_bytes(packed)
    (shipped / "results.jsonl").unlink()
    assert main(_sweep_args(shipped)) == 0
    resumed = read_rows(shipped / "results.jsonl")
    assert _stable(resumed) == _stable(full)
    assert resumed[:2] == [json.loads(line) for line in data.decode().splitlines()]  # kept, timings too: not rerun
    assert (shipped / "results.jsonl.gz").read_bytes() == packed  # the archive untouched

    # Resuming with other options is refused, naming what differs.
    assert main(_sweep_args(part, "--seed", "1")) == 2
    with pytest.raises(RunError, match="seed"):
        _run_cli(_sweep_args(part, "--seed", "1"))


def _run_cli(argv: list[str]) -> int:
    """The command without main's error handling, so a test sees the exception main turns into a message."""
    from midlens.cli import build_parser

    args = build_parser().parse_args(argv)
    return args.func(args)


def test_sweep_stopped_at_line_end_scores_the_same_and_says_so(tmp_path, loaded):
    from midlens.cli import main
    from midlens.eval.runner import read_rows

    assert main(_sweep_args(tmp_path / "full", "--max-new-tokens", "24")) == 0
    assert main(_sweep_args(tmp_path / "stop", "--max-new-tokens", "24", "--stop-at-line-end")) == 0
    full, stop = (sorted(read_rows(tmp_path / d / "results.jsonl"), key=lambda r: r["order"]) for d in ("full", "stop"))
    assert [r["em"] for r in stop] == [r["em"] for r in full] and [r["f1"] for r in stop] == [r["f1"] for r in full]
    # The stopping itself (fewer tokens, the same first line) is tested on prompts that run past one line in
    # test_evidence.py; here: the sweep passes the option on, records it, and scores the same.
    assert all("\n" not in r["prediction"] for r in stop)
    assert json.loads((tmp_path / "stop" / "config.json").read_text())["stop_at_line_end"] is True
    assert "stop_at_line_end" not in json.loads((tmp_path / "full" / "config.json").read_text())


def test_rerank_run_and_report(tmp_path, loaded):
    from midlens.cli import main
    from midlens.eval.report import write_report
    from midlens.eval.runner import read_rows

    out = tmp_path / "rerank"
    args = ["eval", "rerank", "--dataset", "hotpotqa", "--n", "1", "--max-words", "25", "--no-progress"]
    assert main(args + ["--out", str(out)]) == 0
    (row,) = read_rows(out / "results.jsonl")
    assert set(row["rankers"]) == {"dense", "bm25", "evidence_raw", "evidence_calibrated"}
    for metrics in row["rankers"].values():
        assert all(0 <= v <= 1 for v in metrics.values())
        assert metrics["recall@1"] <= metrics["recall@2"] <= metrics["recall@5"]
    assert main(_sweep_args(tmp_path / "sweep")) == 0

    assert main(_sweep_args(tmp_path / "sweep2", "--max-new-tokens", "2")) == 0

    # The same run passed twice counts once; a run under another token budget gets its own table.
    report = write_report([tmp_path / "sweep", tmp_path / "sweep2", tmp_path / "sweep", out], tmp_path / "report")
    text = report.read_text()
    assert "| baseline | " in text and "gold@1 | gold@3" in text
    tables = [line for line in text.splitlines() if line.startswith("## Position sweep")]
    assert len(tables) == 2 and all("n = 2 questions" in t for t in tables)
    assert any("4 new tokens" in t for t in tables) and any("2 new tokens" in t for t in tables)
    assert "| evidence_calibrated |" in text
    # Every accuracy and recall comes with its 95 % bootstrap interval.
    assert re.search(r"\| baseline \| \d+\.\d \[\d+\.\d, \d+\.\d\] \|", text)
    assert re.search(r"\| evidence_raw \| \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\] \|", text)
    for name in ("accuracy_vs_position.png", "evidence_rank_vs_position.png", "reranker_recall.png"):
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_e2e_unit(pipeline):
    from midlens.eval.e2e import evaluate_e2e

    q = {
        "question": "What film is a sequel to Wings of Desire?",
        "answers": ["Faraway, So Close!"],
        "gold_titles": ["Wings of Desire", "Richard Reitinger"],
    }
    row = evaluate_e2e(pipeline.with_method("baseline"), q)
    assert len(row["retrieved"]) == pipeline.options.top_k
    assert row["retrieval_recall"] == len(set(q["gold_titles"]) & set(row["retrieved"])) / 2
    assert 0 <= row["evidence_recall@2"] <= row["retrieval_recall"]
    assert row["em"] == best_subspan_em(row["prediction"], q["answers"])


def test_bootstrap_interval_matches_the_normal_approximation():
    from midlens.eval.metrics import bootstrap_ci

    values = [1.0] * 40 + [0.0] * 160  # p = 0.2, n = 200: standard error sqrt(0.2 * 0.8 / 200) = 0.0283
    lo, hi = bootstrap_ci(values)
    assert lo < 0.2 < hi
    # The percentile bootstrap (2000 resamples) and the normal approximation agree to ~10 % at this n.
    assert (hi - lo) / 2 == pytest.approx(1.96 * 0.0283, rel=0.15)
    assert bootstrap_ci(values) == (lo, hi)  # seeded: a report is reproducible
    assert bootstrap_ci([0.0] * 5) == (0.0, 0.0)
    assert all(x != x for x in bootstrap_ci([]))


def test_a_ratio_interval_resamples_the_pairs_together():
    import numpy as np

    from midlens.eval.metrics import ratio_ci

    rng = np.random.default_rng(1)
    reference = rng.exponential(10.0, 40)
    # Each answer's drop a fixed share of the reference's: resampled in pairs, every resample has that ratio.
    assert ratio_ci(0.8 * reference, reference) == pytest.approx((0.8, 0.8))
    noisy = 0.8 * reference + rng.normal(0, 2.0, 40)
    lo, hi = ratio_ci(noisy, reference)
    assert lo < noisy.mean() / reference.mean() < hi and hi - lo < 0.3
    # Unpaired, the two means' spreads would add up: the paired interval is the narrower.
    shuffled = ratio_ci(noisy, rng.permutation(reference))
    assert hi - lo < shuffled[1] - shuffled[0]
    with pytest.raises(ValueError, match="one pair per unit"):
        ratio_ci([1.0, 2.0], [1.0])


def test_paired_difference_against_the_baseline_is_narrower_than_unpaired():
    from midlens.eval.report.summarise import sweep_summary

    # 100 questions; the method answers exactly what the baseline answers plus 10 more, at every position.
    # Unpaired, each method's interval is about +-9 points wide; paired, every difference is 0 or 1/3
    # and the interval of the +10-point mean must exclude zero.
    rows = []
    for i in range(100):
        for p in (1, 5, 10):
            base = float(i % 3 == 0)
            for m, em in (("baseline", base), ("moice", 1.0 if i < 10 else base)):
                row = dict(kind="sweep", dataset="d", k=10, method=m, position=p, example_id=f"q{i}")
                row.update(em=em, f1=em, logprob=-1.0 - (m == "baseline"), gold_rank=1, gold_share=0.1, seconds=1.0)
                rows.append(row)
    (summary,) = sweep_summary(rows).values()
    em, (lo, hi) = summary["paired"]["moice"]["em"]
    expected = sum(1 - float(i % 3 == 0) for i in range(10)) / 100  # the 10 questions not already right
    assert em == pytest.approx(expected)
    assert 0 < lo < em < hi
    assert summary["paired"]["moice"]["logprob"][0] == pytest.approx(1.0)
    assert summary["paired"]["moice"]["logprob"][1] == (1.0, 1.0)  # no spread: the interval is the point


def test_report_refuses_a_non_run_dir(tmp_path):
    from midlens.cli import main
    from midlens.eval.runner import RunError

    assert main(["eval", "report", str(tmp_path)]) == 2
    with pytest.raises(RunError, match="not a run directory"):
        from midlens.eval.report import write_report

        write_report([tmp_path], tmp_path)


def test_write_atomic_replaces_whole_files_with_the_usual_permissions(tmp_path):
    import os

    from midlens.core.files import write_atomic

    path = tmp_path / "sub" / "report.md"
    write_atomic(path, "one\n")
    write_atomic(path, b"two\n")
    assert path.read_text() == "two\n" and [p.name for p in path.parent.iterdir()] == ["report.md"]
    previous = os.umask(0o027)  # an unusual umask, so a hard-coded 0o644 could not pass
    try:
        write_atomic(path, "three\n")
        assert path.stat().st_mode & 0o777 == 0o640  # 0o666 & ~umask, not mkstemp's 0600
        assert os.umask(0o027) == 0o027  # and the umask was left as it was
    finally:
        os.umask(previous)


def test_report_keeps_e2e_runs_with_different_retrieval_apart_and_pairs_them(tmp_path):
    from midlens.eval.report.load import load_runs
    from midlens.eval.report.render import markdown

    runs = []
    for retrieval, right in (("dense", 1), (None, 1), ("hybrid", 3)):  # None: a run from before the option
        run = tmp_path / f"run-{retrieval}"
        run.mkdir()
        config = {"kind": "e2e", "model": "m", "top_k": 5, "max_new_tokens": 16, "retrieval": retrieval}
        (run / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        rows = [
            dict(key=f"q{i}|baseline", example_id=f"q{i}", kind="e2e", dataset="qs", method="baseline", f1=0.0)
            | {"em": float(i < right), "retrieval_recall": 1.0, "evidence_recall@2": 0.5, "seconds": 1.0}
            for i in range(4)
        ]
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    configs, rows = load_runs(runs)
    text = markdown(configs, rows)
    # The pre-option run reads as dense and merges with it (same units, same setting); hybrid stays apart.
    assert "| qs, retrieval=dense | baseline | 4 | 25.0" in text
    assert "| qs, retrieval=hybrid | baseline | 4 | 75.0" in text
    # Paired on the same four questions against the first run given: questions 1 and 2 flip to right, none back.
    assert "minus **qs, retrieval=dense / baseline**" in text
    assert "| qs, retrieval=hybrid | baseline | 4 | +50.0 [+0.0, +100.0] | +0.0 [+0.0, +0.0] |" in text


def test_a_run_whose_results_are_gzipped_reports_the_same_rows(tmp_path):
    import gzip

    from midlens.eval.report.load import load_runs
    from midlens.eval.runner import RunError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "sweep", "model": "m", "methods": {}}))
    rows = [{"key": f"q{i}|baseline|1", "method": "baseline", "example_id": f"q{i}", "em": i % 2} for i in range(5)]
    plain = "".join(json.dumps(r) + "\n" for r in rows)
    (run / "results.jsonl").write_text(plain)
    _, before = load_runs([run])
    (run / "results.jsonl").unlink()
    (run / "results.jsonl.gz").write_bytes(gzip.compress(plain.encode()))  # as committed under docs/results
    _, after = load_runs([run])
    assert after == before and len(after) == 5
    (run / "results.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(RunError, match="results.jsonl.gz: not a readable gzip file"):
        load_runs([run])


def test_runs_of_one_method_name_under_different_defaults_stay_apart(tmp_path):
    from midlens.eval.report.load import load_runs
    from midlens.generators.methods.attn_calibration import DEFAULTS

    # The same typed name, "attn-calibration", run before and after its default strength changed.
    for name, strength in (("old", 1.0), ("new", DEFAULTS["strength"])):
        run = tmp_path / name
        run.mkdir()
        methods = {"attn-calibration": {"name": "attn-calibration", **DEFAULTS, "strength": strength, "ordering": None}}
        methods["lcr"] = {"name": "baseline", "ordering": "lcr"}
        (run / "config.json").write_text(json.dumps({"kind": "sweep", "model": "m", "methods": methods}))
        rows = [{"key": f"q1|{m}|1", "method": m, "example_id": "q1", "em": strength} for m in methods]
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, rows = load_runs([tmp_path / "old", tmp_path / "new"])
    by_label = {r["method"]: r for r in rows}
    assert set(by_label) == {"attn-calibration", "attn-calibration(strength=1.0)", "lcr"}
    assert by_label["attn-calibration(strength=1.0)"]["em"] == 1.0 and by_label["attn-calibration"]["em"] != 1.0
    assert by_label["attn-calibration(strength=1.0)"]["key"] == "q1|attn-calibration(strength=1.0)|1"


def test_groups_that_differ_in_one_evidence_option_are_labelled_by_that_option_alone():
    from midlens.eval.report.groups import grouped

    evidence = [{"heads": h, "layers": "upper", "query": "question"} for h in ("all", "retrieval")]
    rows = [{"kind": "rerank", "dataset": "d", "setting": {"evidence": e}} for e in evidence]
    labels = sorted(suffix for suffix, _ in grouped(rows, "rerank", lambda r: r["dataset"]).values())
    assert labels == [", evidence heads=all", ", evidence heads=retrieval"]  # short enough for a plot title


def test_reranker_differences_are_paired_per_question_over_questions_every_method_ranked():
    from midlens.eval.report.render import markdown
    from midlens.eval.report.summarise import RANK_METRICS, rerank_paired

    def row(q, method, raw, dense, bm25=0.5):
        rankers = {"dense": dense, "bm25": bm25, "evidence_raw": raw, "evidence_calibrated": raw}
        rankers = {k: dict.fromkeys(RANK_METRICS, v) for k, v in rankers.items()}
        return {"kind": "rerank", "dataset": "d", "setting": {}, "example_id": q, "method": method, "rankers": rankers}

    rows = [
        row("q1", "baseline", 0.5, 0.5),
        row("q2", "baseline", 1.0, 0.5),
        row("q1", "mudaf", 1.0, 0.5),
        row("q2", "mudaf", 1.0, 0.5),
        row("q3", "mudaf", 0.0, 1.0),  # the baseline has not ranked q3 yet: left out of every difference
    ]
    (s,) = rerank_paired(rows).values()
    assert s["n"] == 2
    cells = s["table"][("mudaf", "evidence_raw")]
    assert cells[("recall@2", None)][0] == 0.25  # (0.5 + 0.0) / 2
    assert cells[("recall@2", "dense")][0] == 0.5 and cells[("recall@2", "bm25")][0] == 0.5
    assert ("recall@2", None) not in s["table"][("baseline", "evidence_raw")]  # not against itself
    assert "| mudaf | evidence_raw | +0.500 [" in markdown([], rows)
    # Against another method (the comparison MuDAF's issue asks for: MuDAF minus plain fine-tuning).
    (s,) = rerank_paired(rows, against="mudaf").values()
    assert s["table"][("baseline", "evidence_raw")][("recall@2", None)][0] == -0.25


def test_report_against_a_method_the_runs_lack_is_refused_by_name(tmp_path):
    from midlens.eval.report import write_report
    from midlens.eval.runner import RunError

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"kind": "rerank", "methods": {"baseline": {"name": "baseline"}}}))
    rankers = {
        k: dict.fromkeys(("recall@1", "recall@2", "recall@5", "mrr", "ndcg@10"), 0.5)
        for k in ("dense", "bm25", "evidence_raw", "evidence_calibrated")
    }
    row = {
        "key": "q1|baseline",
        "order": 0,
        "kind": "rerank",
        "dataset": "d",
        "example_id": "q1",
        "method": "baseline",
        "rankers": rankers,
    }
    (run / "results.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(RunError, match=r'against="mudaf\(alpha=0\)": .*choose one of baseline'):
        write_report([run], tmp_path / "report", against="mudaf(alpha=0)")


def test_an_e2e_method_run_in_one_setting_still_names_the_setting_that_tells_it_apart(tmp_path):
    from midlens.eval.report.load import load_runs
    from midlens.eval.report.render import markdown

    runs = []
    for model, method in (("m1", "baseline"), ("m2", "baseline"), ("m1", "attn-calibration")):
        run = tmp_path / f"{model}-{method}"
        run.mkdir()
        config = {"kind": "e2e", "model": model, "top_k": 5, "max_new_tokens": 16, "retrieval": "dense"}
        (run / "config.json").write_text(json.dumps(config))
        rows = [
            dict(key=f"q{i}|{method}", example_id=f"q{i}", kind="e2e", dataset="qs", method=method, f1=0.0)
            | {"em": 1.0, "retrieval_recall": 1.0, "evidence_recall@2": 0.5, "seconds": 1.0}
            for i in range(2)
        ]
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append(run)
    text = markdown(*load_runs(runs))
    # Before, the lone attn-calibration group had no siblings of its own method and read "| qs | attn-calibration |".
    assert "| qs, model=m1 | attn-calibration | 2 |" in text
    assert "| qs, model=m2 | baseline | 2 |" in text


def test_batched_sweep_rows_equal_batch_one_and_resume_at_another_size(tmp_path, loaded):
    """Rows of a sweep run in batches equal the batch-1 run's (metrics within 1e-4 where they are floats from
    attention or log-probabilities, the same predictions), a reused lcr prompt included; an
    interrupted batched run resumes at another batch size."""
    from midlens.cli import main
    from midlens.eval.runner import read_rows

    methods = ["--methods", "baseline", "--orderings", "lcr", "--n", "3"]
    assert main(_sweep_args(tmp_path / "one", *methods)) == 0
    assert main(_sweep_args(tmp_path / "four", *methods, "--batch-size", "4")) == 0
    assert main(_sweep_args(tmp_path / "part", *methods, "--batch-size", "4", "--limit", "5")) == 0
    assert main(_sweep_args(tmp_path / "part", *methods, "--batch-size", "3")) == 0
    one = _stable(read_rows(tmp_path / "one" / "results.jsonl"))
    assert any("reused_from_position" in r for r in one)
    for other in ("four", "part"):
        rows = _stable(read_rows(tmp_path / other / "results.jsonl"))
        assert [r["key"] for r in rows] == [r["key"] for r in one]
        for a, b in zip(one, rows, strict=True):
            assert a.keys() == b.keys()
            for k in a:
                same = a[k] == pytest.approx(b[k], abs=1e-4) if isinstance(a[k], float) else a[k] == b[k]
                assert same, (k, a[k], b[k])
    assert main(_sweep_args(tmp_path / "bad", "--batch-size", "0")) == 2


@pytest.mark.slow
def test_ray_engine_rows_equal_in_process_and_survive_a_killed_worker(tmp_path, loaded, monkeypatch):
    """Two Ray workers x 1 thread on a local cluster: a run stopped after 2 units (--limit) resumes, grown to more
    questions, a worker is killed (SIGKILL) during the resumed run, and the rows are still every unit exactly once,
    equal to the in-process engine's. One cluster and two pools: each pool loads the model in every worker, the
    test's main cost."""
    import os
    import signal
    import threading

    import ray

    from midlens.cli import main
    from midlens.eval import runner
    from midlens.eval.runner import read_rows

    many = ["--n", "8"]
    assert main(_sweep_args(tmp_path / "local", *many)) == 0
    local = read_rows(tmp_path / "local" / "results.jsonl")
    ray_args = ["--engine", "ray", "--workers", "2", "--threads-per-worker", "1"]
    killed = tmp_path / "ray"
    path = killed / "results.jsonl"
    try:
        # Started on 4 questions and stopped after 2 units; the resumed run below grows it to 8 (the driver checks
        # the first 4 by the hash the planning task returns: it holds no data).
        assert main(_sweep_args(killed, "--n", "4", *ray_args, "--limit", "2")) == 0
        assert len(read_rows(path)) == 2

        # The resumed run, a worker killed while it goes on: its group is retried on a restarted actor.
        written = threading.Event()  # set once the driver has written a row: the worker's pid is on disk
        write_rows = runner.write_rows

        def signalled(rows):
            for row in rows:
                yield row
                written.set()  # the writer asks for the next row only after writing this one

        monkeypatch.setattr(
            runner, "write_rows", lambda path, config, rows, *a, **k: write_rows(path, config, signalled(rows), *a, **k)
        )
        result = {}
        thread = threading.Thread(target=lambda: result.update(rc=main(_sweep_args(killed, *many, *ray_args))))
        thread.start()
        assert written.wait(timeout=600), "no row was written"  # the timeout only turns a hang into a failure
        rows = read_rows(path)
        assert 2 < len(rows) < len(local), "the run ended before a worker could be killed"
        victim = rows[-1]["worker"]  # a worker of this run's pool (the --limit run's pool is gone)
        os.kill(victim, signal.SIGKILL)
        thread.join(timeout=600)
        assert result.get("rc") == 0
        after = read_rows(path)
        assert len({r["key"] for r in after}) == len(after) == len(local)
        assert _stable(after, "config_sha256") == _stable(local, "config_sha256")
        assert json.loads((killed / "config.json").read_text())["extended"] == [4]
        assert any(r["worker"] != victim for r in after[len(rows) :])  # rows after the kill came from another process
    finally:
        ray.shutdown()


def test_squad_examples_stack_the_gold_paragraph_with_retrieved_non_answering_ones():
    from midlens.eval.datasets import load_squad
    from midlens.eval.metrics import normalize_answer

    examples = load_squad(20, seed=3, k=6)
    assert len(examples) == 20 and [e.id for e in load_squad(20, seed=3, k=6)] == [e.id for e in examples]
    assert [e.id for e in load_squad(10, seed=3, k=6)] == [e.id for e in examples[:10]]  # a prefix, as everywhere
    for ex in examples:
        assert len(ex.passages) == 6 and len(ex.distractors) == 5
        answers = [normalize_answer(a) for a in ex.answers]
        assert any(a in normalize_answer(ex.gold.text) for a in answers), (ex.question, ex.answers)
        for d in ex.distractors:
            assert not any(a and a in normalize_answer(d.text) for a in answers)
        assert len({p.id for p in ex.passages}) == 6
    # Distractors are retrieved: most share a title (article) with the gold, which random paragraphs would not.
    same_article = sum(d.title == ex.gold.title for ex in examples for d in ex.distractors)
    assert same_article > 0.3 * 5 * len(examples)


def test_rerank_and_e2e_in_batches_equal_one_at_a_time(generator, pipeline):
    """The batched evaluators give the rows the one-at-a-time ones give (metrics from evidence within 1e-4)."""
    from midlens.eval.datasets import load_hotpotqa
    from midlens.eval.e2e import evaluate_e2e, evaluate_e2e_many
    from midlens.eval.rerank import evaluate_rerank, evaluate_rerank_many
    from midlens.retrievers.corpus import default_questions_path

    examples = load_hotpotqa(3, seed=5, mode="rerank", max_words=40)
    alone = [evaluate_rerank(generator, ex) for ex in examples]
    batched = evaluate_rerank_many(generator, examples, batch_size=3)
    for a, b in zip(alone, batched, strict=True):
        for ranker, metrics in a["rankers"].items():
            assert metrics == pytest.approx(b["rankers"][ranker], abs=1e-4), ranker

    questions = [json.loads(line) for line in default_questions_path().read_text().splitlines()[:3]]
    one = [evaluate_e2e(pipeline, q) for q in questions]
    many = evaluate_e2e_many(pipeline, questions, batch_size=3)
    strip = lambda row: {k: v for k, v in row.items() if k != "seconds"}  # noqa: E731
    assert [strip(r) for r in many] == [strip(r) for r in one]


def test_unit_groups_follow_the_examples_so_a_cut_run_leaves_whole_examples():
    """Groups hold one method and whole examples; taken in order, each chunk (one group per method) finishes the
    same examples for every method, so a run cut anywhere has paired rows, and a method already done for some
    examples (a resumed run) does not hold the others back."""
    from midlens.eval.runner import unit_groups

    units = [
        {"example": e, "method": m, "position": p, "key": f"{e}|{m}|{p}"}
        for e in range(6)
        for m in ("baseline", "ms-poe")
        for p in (1, 5, 10)
    ]
    groups = unit_groups(units, 4)
    assert sorted(u["key"] for g in groups for u in g) == sorted(u["key"] for u in units)
    assert [(g[0]["method"], sorted({u["example"] for u in g})) for g in groups] == [
        ("baseline", [0, 1]),
        ("ms-poe", [0, 1]),
        ("baseline", [2, 3]),
        ("ms-poe", [2, 3]),
        ("baseline", [4, 5]),
        ("ms-poe", [4, 5]),
    ]
    assert all(len({u["method"] for u in g}) == 1 and len(g) == 6 for g in groups)  # whole examples, >= 4 units
    resumed = [u for u in units if not (u["method"] == "baseline" and u["example"] < 4)]
    assert [(g[0]["method"], sorted({u["example"] for u in g})) for g in unit_groups(resumed, 4)] == [
        ("ms-poe", [0, 1]),
        ("ms-poe", [2, 3]),
        ("ms-poe", [4, 5]),
        ("baseline", [4, 5]),
    ]


def test_planning_a_run_loads_no_model_and_its_options_pickle(tmp_path, monkeypatch):
    """The config and units of a run are a function of its RunOptions alone; the options travel to Ray workers."""
    import pickle

    from midlens.eval.options import RunOptions
    from midlens.eval.plan import plan_run
    from midlens.generators.models import loading

    def refuse(*args, **kwargs):
        raise AssertionError("planning loaded a model")

    monkeypatch.setattr(loading, "load_model", refuse)
    options = RunOptions(
        mode="sweep", out=tmp_path, dataset="kv", k=3, n=2, methods=("baseline", "ms-poe"), orderings=("lcr",)
    )
    plan = plan_run(options)
    assert plan.config["positions"] == [1, 3] and plan.config["units"] == len(plan.units) == 2 * 3 * 2
    assert plan.config["methods"]["lcr"]["ordering"] == "lcr" and plan.config["methods"]["ms-poe"]["name"] == "ms-poe"
    assert plan.group_size == 1 and plan.config["device"] == str(plan.device)
    assert pickle.loads(pickle.dumps(options)) == options


def test_run_options_refuse_what_the_command_line_would_in_either_spelling(tmp_path):
    from midlens.cli.options import cli_spelling
    from midlens.core.errors import MidlensError
    from midlens.eval.options import RunOptions

    with pytest.raises(MidlensError) as err:
        RunOptions(mode="sweep", out=tmp_path, k=3, positions=(1, 4))
    assert str(err.value) == "positions=(1, 4): [4] outside 1..3 (K)."
    assert err.value.render(cli_spelling) == "--positions 1,4: [4] outside 1..3 (K)."
    with pytest.raises(MidlensError) as err:
        RunOptions(mode="sweep", out=tmp_path, methods=(), orderings=())
    assert err.value.render(cli_spelling) == "no method to run. To fix it, pass --methods baseline to run one."
    assert str(err.value) == 'no method to run. To fix it, pass methods="baseline" to run one.'


def test_the_sweep_report_shows_em_f1_and_answer_length_side_by_side():
    """Two methods with the same answers in different styles: the sentence earns EM but loses F1, and the length
    column says why (the table the short-answer comparison is decided on)."""
    from midlens.eval.report.render import markdown

    def row(i: int, method: str, prediction: str, em: float, f1: float) -> dict:
        return {
            "key": f"q{i}|{method}|1", "kind": "sweep", "dataset": "d", "k": 2, "method": method, "position": 1,
            "example_id": f"q{i}", "prediction": prediction, "em": em, "f1": f1, "gold_rank": 1, "gold_share": 0.5,
            "logprob": -1.0, "seconds": 1.0,
        }  # fmt: skip

    rows = [row(i, "baseline", "The answer is Paris, the capital.\nmore", 1.0, 0.25) for i in range(4)]
    rows += [row(i, "short", "Paris", 1.0, 1.0) for i in range(4)]
    text = markdown([{"kind": "sweep", "model": "m", "methods": {}}], rows)
    assert "| method | EM | F1 | words per answer |" in text
    assert "| baseline | 100.0 [100.0, 100.0] | 25.0 [25.0, 25.0] | 6.0 |" in text
    assert "| short | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] | 1.0 |" in text


def test_the_sweep_report_marks_timings_made_in_different_runs():
    """Rows copied from another run keep that run's timing: the s/example column says it is no cost ratio then."""
    from midlens.eval.report.render import markdown

    def row(i: int, method: str, run: str) -> dict:
        return {
            "key": f"q{i}|{method}|1", "kind": "sweep", "dataset": "d", "k": 2, "method": method, "position": 1,
            "example_id": f"q{i}", "prediction": "Paris", "em": 1.0, "f1": 1.0, "gold_rank": 1, "gold_share": 0.5,
            "logprob": -1.0, "seconds": 1.0 if method == "a" else 2.0, "config_sha256": run,
        }  # fmt: skip

    config = [{"kind": "sweep", "model": "m", "methods": {}}]
    one_run = [row(i, m, "r1") for i in range(3) for m in ("a", "b")]
    assert "| 1.00 |" in markdown(config, one_run) and "†" not in markdown(config, one_run)
    copied = [row(i, m, "r0" if m == "a" else "r1") for i in range(3) for m in ("a", "b")]
    text = markdown(config, copied)
    assert "| 1.00 † |" in text and "| 2.00 † |" in text and "no cost ratio" in text


def test_the_default_rule_needs_every_corpus_right_answers_and_no_worse_position():
    """A candidate replaces the baseline only if it answers right more often (EM, paired interval above zero) on
    HotpotQA, SQuAD and NQ-open, worse at no gold position, and, where its answers run more than half again as long,
    without losing F1; one corpus that says no decides, a missing corpus leaves it undecided (the baseline stays);
    the report says which default its sweeps support, with the gap and the worst slot."""
    from midlens.eval.report.default_rule import CORPORA, chosen, judge
    from midlens.eval.report.render import markdown

    def rows_for(
        dataset: str,
        method: str,
        em_by_position: dict[int, list[float]],
        f1_gain: float,
        prediction: str = "x",
        style: str = "litm",
    ) -> list[dict]:
        out = []
        for p, ems in em_by_position.items():
            for i, em in enumerate(ems):
                out.append({
                    "key": f"{dataset}{i}|{method}|{p}", "kind": "sweep", "dataset": dataset, "k": 10,
                    "method": method, "position": p, "example_id": f"{dataset}{i}", "prediction": prediction,
                    "em": em, "f1": min(1.0, 0.3 + f1_gain + 0.01 * (i % 3)), "gold_rank": 1, "gold_share": 0.5,
                    "logprob": -1.0, "seconds": 1.0, "setting": {"model": "m", "prompt_style": style},
                })  # fmt: skip
        return out

    n = 20
    base = {p: [float(i % 4 == 0) for i in range(n)] for p in (1, 5, 10)}  # 25 % EM at every position
    better = {p: [float(i % 4 == 0 or i % 4 == 1) for i in range(n)] for p in (1, 5, 10)}  # 50 %, same questions
    worse_at_10 = {**better, 10: [0.0] * n}
    rows = []
    for ds in CORPORA:
        rows += rows_for(ds, "baseline", base, 0.0)
        rows += rows_for(ds, "good", better, 0.2)
        rows += rows_for(ds, "em-only", better, 0.0)  # same F1, same length: right answers decide, it passes
        rows += rows_for(ds, "hedges", better, -0.1, "a b c d e")  # 5x the words and F1 lost: fails
        rows += rows_for(ds, "dips", worse_at_10, 0.2)
    verdicts = {v.method: v for v in judge(rows)}
    assert verdicts["good"].passes and verdicts["em-only"].passes and chosen(judge(rows)) in ("good", "em-only")
    assert not verdicts["hedges"].passes and any("longer answers that lose F1" in r for r in verdicts["hedges"].reasons)
    assert not verdicts["dips"].passes and any("gold@10" in r for r in verdicts["dips"].reasons)
    # Every dip is said with its paired interval: 25 % of the questions lost at slot 10, none gained.
    assert any("gold@10 EM 0.0 below 25.0 (paired -25.0 [" in r for r in verdicts["dips"].reasons)
    one_corpus = [r for r in rows if r["dataset"] == "hotpotqa"]
    partial = {v.method: v for v in judge(one_corpus)}
    assert (
        not partial["good"].passes and not partial["good"].decided and partial["good"].missing == ["squad", "nq-open"]
    )
    assert partial["dips"].decided and not partial["dips"].passes  # one corpus that says no decides
    assert chosen(judge(one_corpus)) == "baseline"
    text = markdown([{"kind": "sweep", "model": "m", "methods": {}}], rows)
    assert "**Supported default: em-only.**" in text or "**Supported default: good.**" in text
    assert "| gap | worst |" in text and "undecided" not in text
    assert "EM vs baseline per gold slot, paired" in text and "- dips: @1 +25.0 [" in text and "@10 -25.0 [" in text
    assert "undecided: squad, nq-open not run" in markdown([{"kind": "sweep", "model": "m", "methods": {}}], one_corpus)
    renamed = [
        {**r, "method": "mudaf(alpha=0)"} if r["method"] == "good" else r for r in rows if r["method"] != "em-only"
    ]
    assert "**Supported default: mudaf(alpha=0) (`finetuned`).**" in markdown([{"kind": "sweep"}], renamed)
    no_winner = [r for r in rows if r["method"] not in ("good", "em-only")]
    assert chosen(judge(no_winner)) == "baseline"
    # Another instruction is part of the candidate: labelled, judged against the baseline under the reference one.
    short = [r for ds in CORPORA for r in rows_for(ds, "finetuned", better, 0.2, style="short")]
    styled = {v.method: v for v in judge(no_winner + short)}
    assert styled["finetuned @short"].passes and chosen(judge(no_winner + short)) == "finetuned @short"
    # Restacking adds a prefill per answer: it must also beat its method alone (paired over the corpora's questions).
    rows = [r for r in rows if r["method"] != "em-only"]
    same = [{**r, "method": "good+restack(mudaf)", "key": r["key"] + "r"} for r in rows if r["method"] == "good"]
    tie = {v.method: v for v in judge(rows + same)}
    assert not tie["good+restack(mudaf)"].passes and "over good alone" in tie["good+restack(mudaf)"].reasons[0]
    assert chosen(judge(rows + same)) == "good"
    best = {p: [1.0] * n for p in (1, 5, 10)}
    gains = [r for ds in CORPORA for r in rows_for(ds, "good+restack(mudaf)", best, 0.3)]
    assert chosen(judge(rows + gains)) == "good+restack(mudaf)"


def test_the_default_rule_refuses_runs_answered_under_different_conditions(tmp_path):
    """Rows answered with another token budget, stop rule, passage length or dtype are no comparison: the rule
    names the field and both runs instead of pairing them."""
    from midlens.eval.report.default_rule import IncomparableRuns, check_comparable

    config = {"model": "m", "max_new_tokens": 48, "max_words": 100, "k": 10, "positions": [1, 5, 10],
              "examples": 200, "seed": 0, "dtype": "bfloat16", "evidence": {"layers": "upper"}}  # fmt: skip
    assert check_comparable([config, {**config, "prompt_style": "short"}])["max_new_tokens"] == 48
    for field, value in (("max_new_tokens", 16), ("dtype", "float32"), ("max_words", 0), ("examples", 100)):
        with pytest.raises(IncomparableRuns, match=rf"b answered with {field}={value!r}, .*a with {field}="):
            check_comparable([config, {**config, field: value}], [tmp_path / "a", tmp_path / "b"])
    # The report says so instead of a verdict.
    from midlens.eval.report.render import markdown

    rows = [
        {"key": f"{ds}{i}|{m}|1", "kind": "sweep", "dataset": ds, "k": 10, "method": m, "position": 1,
         "example_id": f"{ds}{i}", "prediction": "x", "em": float(m == "b" or i % 2), "f1": 0.5, "gold_rank": 1,
         "gold_share": 0.5, "logprob": -1.0, "seconds": 1.0}
        for ds in ("hotpotqa", "squad") for m in ("baseline", "b") for i in range(4)
    ]  # fmt: skip
    runs = [{**config, "kind": "sweep"}, {**config, "kind": "sweep", "max_new_tokens": 16}]
    assert "Not judged: run 2 answered with max_new_tokens=16, run 1 with max_new_tokens=48" in markdown(runs, rows)


def test_the_default_rule_judges_a_trained_method_outside_its_training_data():
    """A corpus a method's artefact was trained on is in-domain: shown beside the decision, not in it. A method
    trained on HotpotQA passes on SQuAD alone, whatever it does on HotpotQA (or without HotpotQA rows); a
    training-free method still needs both corpora; one trained on every corpus measured cannot pass."""
    from midlens.eval.report.default_rule import chosen, judge, trained_on

    def rows_for(dataset: str, method: str, em: float) -> list[dict]:
        return [
            {"key": f"{dataset}{i}|{method}|{p}", "kind": "sweep", "dataset": dataset, "k": 10, "method": method,
             "position": p, "example_id": f"{dataset}{i}", "prediction": "x",
             "em": float(i % 4 == 0 or (em > 0.3 and i % 4 == 1)), "f1": min(1.0, em + 0.01 * (i % 3)),
             "gold_rank": 1, "gold_share": 0.5, "logprob": -1.0, "seconds": 1.0}
            for p in (1, 5, 10) for i in range(20)
        ]  # fmt: skip

    every = ("hotpotqa", "squad", "nq-open")
    trained = {"in-domain-only": {"hotpotqa"}, "squad-only": {"hotpotqa"}, "everywhere": set(every)}
    rows = [r for ds in every for r in rows_for(ds, "baseline", 0.25)]
    rows += rows_for("hotpotqa", "in-domain-only", 0.1)  # worse in-domain
    rows += rows_for("squad", "in-domain-only", 0.5) + rows_for("nq-open", "in-domain-only", 0.5)
    rows += rows_for("squad", "squad-only", 0.5) + rows_for("squad", "free", 0.5) + rows_for("nq-open", "free", 0.5)
    rows += [r for ds in every for r in rows_for(ds, "everywhere", 0.5)]
    verdicts = {v.method: v for v in judge(rows, trained=lambda m, model: frozenset(trained.get(m, ())))}
    assert verdicts["in-domain-only"].passes and verdicts["in-domain-only"].in_domain == ["hotpotqa"]
    assert not verdicts["squad-only"].passes and verdicts["squad-only"].missing == ["nq-open"]
    assert not verdicts["free"].passes and verdicts["free"].missing == ["hotpotqa"] and not verdicts["free"].decided
    everywhere = verdicts["everywhere"]
    assert not everywhere.passes and "no corpus outside its training data" in everywhere.reasons[0]
    assert chosen(judge(rows, trained=lambda m, model: frozenset())) == "everywhere"  # judged in-domain: it wins
    # Read from the shipped artefacts' metadata (all trained on HotpotQA's train split); a restack's scorer counts.
    assert trained_on("mudaf", "gemma3-270m") == trained_on("mudaf(alpha=0)", "smollm2-135m") == {"hotpotqa"}
    assert trained_on("baseline+restack(mudaf)", "smollm2-135m") == {"hotpotqa"}
    assert trained_on("channel-scaling", "qwen2.5-coder-0.5b") == {"hotpotqa"}
    assert trained_on("ms-poe", "gemma3-270m") == trained_on("mudaf", None) == trained_on("lcr", "gemma3-270m") == set()
