"""Build the third corpus of the default rule: multi-document QA over NQ-open questions, the canonical
lost-in-the-middle task (Liu et al. 2023), from data that installs nowhere here but is public and small.

Source: `qa_data/nq-open-oracle.jsonl.gz` of github.com/nelson-liu/lost-in-the-middle (MIT; questions from
Natural Questions, CC BY-SA 3.0, passages from Wikipedia via DPR): 2,655 NQ-open questions, each with its gold
100-word passage. The source file is checked against SOURCE_SHA256 before anything is read.

Recipe (no model that answers is involved, so nothing is tuned on it): a seeded sample of `questions`; for each,
the gold passage plus the `k - 1` passages of the other questions' gold set that all-MiniLM-L6-v2 (the packaged
retriever's embedder) puts nearest the question, skipping any that contains one of its answers (normalised
substring, the metric's own test), so every distractor is topical and none answers it. Output: lost-in-the-middle
JSONL.gz (`midlens eval sweep --dataset FILE` reads it; the sweep places the gold at the positions asked).

    python -m midlens.eval.build_nq_mdqa SOURCE.jsonl.gz --out docs/results/as-shipped/nq-open/nq-open-mdqa-10.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import tempfile
from pathlib import Path

from midlens.core.errors import CorpusError

SOURCE_SHA256 = "6a7f72b846f663a133ef952244e5a4e43f06bcf190afe34e8fbe687ce0d1653e"  # the published file, commit 29b8a6d
QUESTIONS = 200
K = 10
SEED = 0
NEAREST = 64  # candidates read per question before answer-bearing ones are skipped


def read_source(path: Path, expected_sha256: str) -> list[dict]:
    """The oracle rows, after checking the file is the published one."""
    if not path.is_file():
        raise CorpusError(f"{path}: not found; it is qa_data/nq-open-oracle.jsonl.gz of nelson-liu/lost-in-the-middle.")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected_sha256:
        raise CorpusError(
            f"{path}: sha256 {digest[:12]}... is not the published file's ({expected_sha256[:12]}...); "
            "fetch qa_data/nq-open-oracle.jsonl.gz again from the repository named in this module."
        )
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def build(rows: list[dict], questions: int = QUESTIONS, k: int = K, seed: int = SEED) -> list[dict]:
    """`questions` examples of `k` passages each: the gold first (the sweep moves it), then the distractors."""
    import faiss

    from midlens.eval.metrics import best_subspan_em
    from midlens.retrievers.dense import embed

    pool: dict[str, dict] = {}
    for row in rows:
        gold = next(c for c in row["ctxs"] if c.get("isgold"))
        pool.setdefault(gold["text"], {"title": gold["title"], "text": gold["text"]})
    passages = list(pool.values())
    index = faiss.IndexFlatIP(384)
    index.add(embed([f"{p['title']}: {p['text']}" for p in passages], show_progress=True))
    picked = random.Random(seed).sample(range(len(rows)), questions)
    queries = embed([rows[i]["question"] for i in picked])
    _, nearest = index.search(queries, NEAREST)
    out = []
    for i, hits in zip(picked, nearest, strict=True):
        row = rows[i]
        gold = next(c for c in row["ctxs"] if c.get("isgold"))
        distractors = [
            passages[j]
            for j in hits
            if passages[j]["text"] != gold["text"] and not best_subspan_em(passages[j]["text"], row["answers"])
        ][: k - 1]
        if len(distractors) < k - 1:
            raise CorpusError(f"question {i}: only {len(distractors)} distractors without its answer in {NEAREST}.")
        ctxs = [{"title": gold["title"], "text": gold["text"], "hasanswer": True, "isgold": True}]
        ctxs += [{**d, "hasanswer": False, "isgold": False} for d in distractors]
        out.append({"id": f"nq-open-oracle:{i}", "question": row["question"], "answers": row["answers"], "ctxs": ctxs})
    return out


def write(examples: list[dict], out: Path) -> str:
    """Atomically (temp file + rename); returns the file's sha256. gzip's mtime is fixed so rebuilds are
    byte-identical."""
    out.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples).encode()
    packed = gzip.compress(data, mtime=0)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(packed)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make a committed corpus unreadable to other users
    os.replace(tmp, out)
    return hashlib.sha256(packed).hexdigest()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="nq-open-oracle.jsonl.gz")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--questions", type=int, default=QUESTIONS)
    parser.add_argument("--k", type=int, default=K)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    rows = read_source(args.source, SOURCE_SHA256)
    digest = write(build(rows, args.questions, args.k, args.seed), args.out)
    print(f"{args.questions} questions x {args.k} passages -> {args.out} (sha256 {digest})")


if __name__ == "__main__":
    main()
