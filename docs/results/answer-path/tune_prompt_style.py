"""Which instruction should `midlens ask` use? Measured on a TUNING slice, never on the 40 end-to-end questions.

60 questions of HotpotQA's train split (seed 1), each with its 2 supporting paragraphs and 3 distractors in a
seeded shuffled order (what top-5 retrieval hands the generator), whole paragraphs; greedy, 24 new tokens;
EM = best_subspan_em on the first line, F1 = SQuAD F1. One JSON line per answer, then a summary line per style.

    OMP_NUM_THREADS=1 python docs/results/answer-path/tune_prompt_style.py smollm2-135m 60 out.jsonl short,litm
"""

import json
import random
import sys
import time

from midlens.eval.datasets import load_hotpotqa
from midlens.eval.metrics import answer_f1, best_subspan_em, first_line
from midlens.generators.answering.generator import Generator

model, n, out, styles = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
examples = load_hotpotqa(n=n, seed=1, mode="rerank", max_words=None, split="train")
rng = random.Random(0)
prompts = []
for ex in examples:
    gold = [p for p in ex.passages if p.id in ex.gold_ids]
    passages = gold + [p for p in ex.passages if p.id not in ex.gold_ids][:3]
    rng.shuffle(passages)
    prompts.append((ex, passages))
gen = Generator(model)
with open(out, "a") as f:
    for style in styles:
        ems, f1s, t0 = [], [], time.time()
        for ex, passages in prompts:
            answer = gen.generate(gen.prompt(ex.question, passages, 24, style=style), 24, calibrate=False)
            ems.append(best_subspan_em(answer.text, ex.answers))
            f1s.append(answer_f1(first_line(answer.text), ex.answers))
            row = {"model": model, "style": style, "id": ex.id, "answers": ex.answers, "prediction": answer.text}
            f.write(json.dumps({**row, "em": ems[-1], "f1": f1s[-1]}) + "\n")
        summary = {"model": model, "style": style, "n": len(ems), "em": 100 * sum(ems) / len(ems)}
        summary |= {"f1": 100 * sum(f1s) / len(f1s), "seconds": round(time.time() - t0)}
        print(json.dumps(summary), flush=True)
