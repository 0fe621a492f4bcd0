"""The 40 embedded HotpotQA questions answered as `midlens ask` answers them (the model's defaults, top 5 of the
embedded corpus), each with whether it is right (EM against the dataset's answer) and its support: which right
answers the support score calls likely supported, which wrong ones it flags.

    python docs/results/support/embedded.py smollm2-135m        # or qwen2.5-coder-0.5b

Writes embedded-<model>.jsonl and prints the 2 x 2 table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from midlens.eval.metrics import best_subspan_em
from midlens.rag.pipeline import Pipeline
from midlens.retrievers.corpus import default_questions_path


def main(model: str) -> None:
    pipe = Pipeline.from_corpus(model=model)
    rows = []
    for line in default_questions_path().read_text().splitlines():
        q = json.loads(line)
        answer = pipe.ask(q["question"])
        rows.append(
            {
                "question": q["question"],
                "answers": q["answers"],
                "text": answer.text,
                "em": best_subspan_em(answer.text, q["answers"]),
                "support": answer.support.to_dict(),
            }
        )
        print(f"{rows[-1]['em']:.0f} {answer.support.probability:.2f} {answer.text[:60]!r}", flush=True)
    out = Path(__file__).parent / f"embedded-{model}.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for right in (1.0, 0.0):
        group = [r for r in rows if r["em"] == right]
        likely = sum(r["support"]["likely"] for r in group)
        print(f"{'right' if right else 'wrong'}: {len(group)}, called likely supported: {likely}")


if __name__ == "__main__":
    main(sys.argv[1])
