"""Every layer's passage attention on gemma3-270m's HotpotQA prompts, stored so evidence rules are compared offline.

One scoring pass per prompt (`Generator.score`: the prefill and the content-free "N/A" pass, nothing generated),
with the probe keeping all 18 layers; each line holds one prompt's raw maps [layers, heads, passages] for the
question query and the last token, their content-free twins, the passages' token spans and the question's. The
prompts are `midlens eval sweep`'s (K = 10, gold at slots 1, 5, 10, 100-word passages, the short prompt style),
so a rule's gold rank here is the sweep's `gold_rank` under that rule. Resumable: a prompt already written is
skipped.

    OMP_NUM_THREADS=1 python docs/results/gemma3-270m/windowed-evidence/collect.py train maps-train.jsonl 40
    OMP_NUM_THREADS=1 python docs/results/gemma3-270m/windowed-evidence/collect.py eval maps-eval.jsonl
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from midlens.eval.datasets import load_hotpotqa
from midlens.eval.sweep import layout
from midlens.generators.answering.generator import Generator
from midlens.generators.attention.evidence import EvidenceConfig

N, SEED, K, SLOTS, MAX_WORDS, STYLE, MAX_NEW = 100, 0, 10, (1, 5, 10), 100, "short", 16


def rounded(t: torch.Tensor) -> list:
    return [[[round(float(x), 7) for x in head] for head in layer] for layer in t]


def main(split: str, out: str, limit: int | None = None) -> None:
    """`limit`: only the first questions of the seeded 100 (a smaller tuning set; the same prefix on resuming)."""
    path = Path(out)
    done = set()
    if path.exists():
        done = {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}
    examples = load_hotpotqa(N, SEED, mode="mdqa", k=K, max_words=MAX_WORDS, split=split)[:limit]
    gen = Generator("gemma3-270m", method="baseline", evidence=EvidenceConfig(layers="all"), citations=None)
    with path.open("a") as f:
        for example in examples:
            for slot in SLOTS:
                key = f"{example.id}|{slot}"
                if key in done:
                    continue
                t0 = time.perf_counter()
                prompt = gen.prompt(example.question, layout(example, K, slot), max_new_tokens=MAX_NEW, style=STYLE)
                answer = gen.score(prompt)
                m = answer.maps
                row = {
                    "key": key,
                    "split": split,
                    "slot": slot,
                    "gold": next(p.position for p in answer.passages if p.passage.id == example.gold_ids[0]),
                    "prompt_tokens": prompt.num_tokens,
                    "spans": [list(s) for s in prompt.passage_spans],
                    "question_span": list(prompt.question_span),
                    "dtype": str(gen.loaded.model.dtype),
                    "seconds": round(time.perf_counter() - t0, 3),
                    "question": rounded(m.question),
                    "null_question": rounded(m.null_question),
                    "last": rounded(m.last),
                    "null_last": rounded(m.null_last),
                }
                f.write(json.dumps(row) + "\n")
                f.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
