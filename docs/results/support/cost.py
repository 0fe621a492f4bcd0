"""What the support score costs on top of generating: the per-step work the decode loop added for it (log-softmax over
the vocabulary, the picked token's log-probability, the top-2 margin) and the features + logistic model per answer,
against the decode step and the answer they come with, timed in one process on this CPU (one thread).

    python docs/results/support/cost.py runs/support/qwen/hotpotqa-train   # any `eval support` run of the model

Writes cost.json beside this file (per model, appended).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from midlens.eval.support import read_run
from midlens.generators.answering.support import SupportModel, support_features

REPEATS = 200


def step_overhead_s(vocab: int, dtype: torch.dtype) -> float:
    """The decode loop's added work for one row and one step (generators/answering/generator.py `_decode`)."""
    logits = torch.randn(1, vocab).to(dtype)
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        greedy = logits.argmax(dim=-1)
        logprobs.gather(-1, greedy[:, None])[:, 0].tolist()
        top2 = logprobs.topk(2, dim=-1).values
        (top2[:, 0] - top2[:, 1]).tolist()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(run: str) -> None:
    torch.set_num_threads(1)
    config, rows = read_run(Path(run))
    from midlens.generators.answering.support import METHOD_PLAIN, shipped_support_folder
    from midlens.generators.models.packaged_models import canonical_name

    model = canonical_name(config["model"])
    vocab = {"qwen2.5-coder-0.5b": 151936, "smollm2-135m": 49152}[model]
    support, _ = SupportModel.load(shipped_support_folder(model, False), METHOD_PLAIN, config["model_sha256"])
    t0 = time.perf_counter()
    for row in rows:
        support.probability(support_features(row["inputs"]))
    per_answer_model_s = (time.perf_counter() - t0) / len(rows)
    decode_per_token = [r["timings"]["decode_s"] / max(1, r["generated_tokens"]) for r in rows]
    answer_s = [sum(v for k, v in r["timings"].items() if k != "verify_s") for r in rows]
    tokens = statistics.mean(r["generated_tokens"] for r in rows)
    overhead = step_overhead_s(vocab, torch.bfloat16)
    out = {
        "model": model,
        "rows": len(rows),
        "step_overhead_ms": 1000 * overhead,
        "decode_step_ms_median": 1000 * statistics.median(decode_per_token),
        "support_model_ms_per_answer": 1000 * per_answer_model_s,
        "answer_s_median_without_verification": statistics.median(answer_s),
        "generated_tokens_mean": tokens,
        # The answers' timings already hold the loop's added work: without it, they would have taken that much less.
        "cost_ratio": (statistics.median(answer_s) + per_answer_model_s)
        / (statistics.median(answer_s) - tokens * overhead),
    }
    path = Path(__file__).parent / "cost.json"
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[model] = out
    path.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
