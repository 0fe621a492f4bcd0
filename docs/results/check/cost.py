"""Cost of checking a given answer: `Generator.attribute` (the prompt and the answer in one teacher-forced pass,
calibrated, cited) against the prompt's prefill alone (`Generator.score` without calibration: the same prefill with
its evidence read, nothing else), and the stock model's plain forward of the prompt as a floor.

    OMP_NUM_THREADS=2 .venv/bin/python docs/results/check/cost.py [--model smollm2-135m] [--passages 10] [--repeats 3]

Prints one JSON line: medians over the repeats (after one warm-up of each) and the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from midlens.core.passage import Passage
from midlens.generators import Generator
from midlens.generators.models.loading import load_model
from midlens.retrievers.corpus import default_corpus_path, read_documents

QUESTION = "Which of these people was born first, and where?"
ANSWER = (
    "The first of them was born in the nineteenth century in a small town. "
    "The second was born decades later, in a large city."
)


def median_seconds(run, repeats: int) -> float:
    run()  # warm-up: allocator and kernels
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", default="baseline")
    parser.add_argument("--passages", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    loaded = load_model(args.model, args.device, args.dtype)
    gen = Generator(loaded, method=args.method)
    docs = read_documents(default_corpus_path())[: args.passages]
    passages = [Passage(text=d["text"], title=d["title"], id=d["id"]) for d in docs]
    prompt = gen.prompt(QUESTION, passages, max_new_tokens=64)
    ids = torch.tensor([prompt.input_ids], device=gen.device)

    def stock() -> None:
        with torch.inference_mode():
            loaded.model(input_ids=ids, use_cache=True, logits_to_keep=1)

    def sync(fn):
        def run():
            fn()
            if gen.device.type == "cuda":
                torch.cuda.synchronize()

        return run

    prefill = median_seconds(sync(lambda: gen.score(prompt, calibrate=False)), args.repeats)
    checked = median_seconds(sync(lambda: gen.attribute(prompt, ANSWER)), args.repeats)
    stock_s = median_seconds(sync(stock), args.repeats)
    answer = gen.attribute(prompt, ANSWER)
    row = {
        "model": args.model,
        "method": args.method,
        "device": str(gen.device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "prompt_tokens": prompt.num_tokens,
        "answer_tokens": answer.generated_tokens,
        "repeats": args.repeats,
        "stock_forward_s": round(stock_s, 4),
        "prefill_with_evidence_s": round(prefill, 4),
        "attribute_s": round(checked, 4),
        "attribute_timings": {k: round(v, 4) for k, v in answer.timings.items()},
        # Within one call, seconds apart: the answer's chunk over the prompt's prefill (the least noisy ratio on
        # a shared machine, where calls minutes apart see other loads).
        "ratio_prefill_plus_answer_over_prefill_same_call": round(
            (answer.timings["prefill_s"] + answer.timings["answer_s"]) / answer.timings["prefill_s"], 3
        ),
        "ratio_attribute_over_prefill": round(checked / prefill, 3),
        "ratio_attribute_over_stock_forward": round(checked / stock_s, 3),
        "tokens_ratio": round((prompt.num_tokens + answer.generated_tokens) / prompt.num_tokens, 3),
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
