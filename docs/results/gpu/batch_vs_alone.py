"""How far a batched row is from the same prompt answered alone, in the model's dtype: the share of rows whose
answer tokens match exactly, and the largest difference of a passage's evidence score.

    python batch_vs_alone.py MODEL_DIR --prompts 16 --batch 16 --device cuda --dtype bfloat16 --json OUT
"""

from __future__ import annotations

import argparse
import json

from midlens.eval.bench_batch import batch_prompts
from midlens.generators import Generator, load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    gen = Generator(load_model(args.model, args.device, args.dtype))
    prompts = batch_prompts(gen, args.prompts)
    alone = [gen.generate_batch([p], max_new_tokens=args.new_tokens)[0] for p in prompts]
    batched = []
    for start in range(0, len(prompts), args.batch):
        batched += gen.generate_batch(prompts[start : start + args.batch], max_new_tokens=args.new_tokens)
    same_tokens = [a.answer_ids == b.answer_ids for a, b in zip(alone, batched, strict=True)]
    # Evidence compared only where the answers match: a different token changes what is scored.
    diffs = [
        max(abs(x.evidence - y.evidence) for x, y in zip(a.passages, b.passages, strict=True))
        for a, b, same in zip(alone, batched, same_tokens, strict=True)
        if same
    ]
    first_divergence = [
        next((i for i, (x, y) in enumerate(zip(a.answer_ids, b.answer_ids, strict=False)) if x != y), None)
        for a, b in zip(alone, batched, strict=True)
    ]
    report = {
        "model": args.model,
        "device": str(gen.device),
        "dtype": args.dtype,
        "prompts": len(prompts),
        "batch": args.batch,
        "new_tokens": args.new_tokens,
        "rows_with_identical_tokens": sum(same_tokens),
        "first_divergent_token": first_divergence,
        "max_evidence_score_diff_identical_rows": max(diffs) if diffs else None,
        "median_evidence_score_diff_identical_rows": sorted(diffs)[len(diffs) // 2] if diffs else None,
    }
    print(json.dumps(report, indent=1))
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
