"""SQuAD's train/eval split by article: a pure function of the title, evaluation reads one side and training the
other, and the runs made before the split (all articles) keep their data to the hash."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from midlens.core.answer_text import normalize_answer
from midlens.eval.datasets import data_sha256, load_squad
from midlens.retrievers.squad import load_squad_dev, split_of, squad_path

ROOT = Path(__file__).resolve().parent.parent


def _article_split(passage_id: str) -> str:
    """The split of the article a paragraph id ("squad:<article index>:<paragraph>") belongs to."""
    return split_of(_titles()[int(passage_id.split(":")[1])])


@functools.cache
def _titles() -> list[str]:
    return [article["title"] for article in json.loads(squad_path().read_text())["data"]]


def test_the_split_is_by_article_disjoint_and_covers_every_question():
    everything, all_questions = load_squad_dev(None)
    sides = {split: load_squad_dev(split) for split in ("eval", "train")}
    titles = {split: {p.title for p in paragraphs} for split, (paragraphs, _) in sides.items()}
    assert titles["eval"] and titles["train"] and not titles["eval"] & titles["train"]
    assert titles["eval"] | titles["train"] == {p.title for p in everything}
    ids = {split: {q.id for q in questions} for split, (_, questions) in sides.items()}
    assert not ids["eval"] & ids["train"] and ids["eval"] | ids["train"] == {q.id for q in all_questions}
    # About a fifth of the articles are held out (13 of 35 here: the hash, not a quota, decides).
    assert 0.1 < len(titles["eval"]) / len(titles["eval"] | titles["train"]) < 0.5
    assert split_of("Normans") == split_of("Normans")  # a function of the title alone


def test_an_eval_split_run_stacks_only_eval_articles_and_the_unsplit_runs_keep_their_hash():
    examples = load_squad(12, seed=1, k=6, max_words=60, split="eval")
    assert len(examples) == 12
    for ex in examples:
        assert len(ex.passages) == 6 and ex.gold_ids == [ex.passages[0].id]
        assert {_article_split(p.id) for p in ex.passages} == {"eval"}  # the distractors too
        gold_text = normalize_answer(ex.passages[0].text)
        assert any(normalize_answer(a) in gold_text for a in ex.answers)
        assert not any(normalize_answer(a) in normalize_answer(p.text) for p in ex.passages[1:] for a in ex.answers)
    # The committed short-answer sweep on all of SQuAD resumes: the same questions and passages, to the hash, on a
    # machine that installed the data elsewhere than the one that made the run (so no install path is hashed).
    assert all(str(squad_path()) not in json.dumps(ex.meta) for ex in examples)
    recorded = ROOT / "docs/results/qwen2.5-coder-0.5b/short-answer/runs/squad/config.json"
    config = json.loads(recorded.read_text())
    again = load_squad(config["examples"], config["seed"], config["k"], config["max_words"])
    assert data_sha256(again) == config["data_sha256"]


def test_sweeps_name_the_squad_split_and_other_datasets_refuse_one(tmp_path):
    from midlens.core.errors import MidlensError
    from midlens.eval.options import RunOptions
    from midlens.eval.plan import plan_run

    def planned(**kw) -> dict:
        return plan_run(RunOptions(mode="sweep", out=tmp_path, n=2, k=4, **kw)).config

    assert planned(dataset="squad", split="eval")["dataset"] == "squad-v2-dev-eval"
    assert planned(dataset="squad")["dataset"] == "squad-v2-dev"  # all articles, as before the split
    assert planned(dataset="hotpotqa")["dataset"] == "hotpotqa"  # HotpotQA's default is its eval split
    with pytest.raises(MidlensError, match="only the hotpotqa and squad datasets have splits"):
        RunOptions(mode="sweep", out=tmp_path, dataset="kv", split="train")


def test_a_mixed_training_set_alternates_the_corpora_and_reads_only_train_articles(loaded):
    from midlens.retrievers.hotpotqa import split_of as hotpotqa_split
    from midlens.training.data import data_record, training_examples
    from midlens.training.recipe import Budget

    squad_ids = {q.id for q in load_squad_dev("train")[1]}
    mixed = training_examples(loaded.tokenizer, 7, seed=0, max_words=40, data="hotpotqa+squad")
    kinds = ["squad" if ex.id in squad_ids else "hotpotqa" for ex in mixed]
    assert kinds == ["hotpotqa", "squad"] * 3 + ["hotpotqa"]  # 4 + 3, alternated
    for ex in mixed:
        if ex.id in squad_ids:
            (gold,) = ex.gold
            assert {_article_split(p.id) for p in ex.prompt.passages} == {"train"}
            answer = loaded.tokenizer.decode(ex.answer_ids[:-1])
            assert normalize_answer(answer) in normalize_answer(ex.prompt.passages[gold].text)
        else:
            assert hotpotqa_split(ex.id) == "train" and len(ex.gold) == 2
    record = data_record(mixed, 0, 40, "hotpotqa+squad")
    assert record["data"] == "hotpotqa+squad" and "SQuAD" in record["dataset"]
    assert "data" not in data_record(mixed[:1], 0, 40)  # HotpotQA-only artefacts keep their record
    with pytest.raises(Exception, match="data 'squad': expected one of hotpotqa, hotpotqa\\+squad"):
        Budget(4, data="squad").check()
