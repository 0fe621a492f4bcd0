"""Evidence against the same prefill without it, Gemma 3 270M, 2k tokens, fp32, one thread: four interleaved pairs
(module, evidence) in one process, after the banded path's fixes.

    OMP_NUM_THREADS=1 python docs/results/windowed-cost/evidence_over_module.py > evidence-over-module.json
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from midlens.eval.bench_runner import bench_prompt
from midlens.generators import Generator, load_model
from midlens.generators.attention.positional_attention import new_cache


def main() -> None:
    torch.set_num_threads(1)
    loaded = load_model("gemma3-270m", "cpu", "float32")
    prompt = bench_prompt(loaded.tokenizer, 2048)
    gen = Generator(loaded, method="baseline")

    def run(probe_on: bool) -> None:
        probe = gen.new_probe(prompt) if probe_on else None
        with gen.running(probe):
            if probe is not None:
                probe.score_rows(list(range(*prompt.question_span)) + [prompt.num_tokens - 1])
            gen.forward(prompt.input_ids, new_cache())
            if probe is not None:
                probe.take()

    run(True)  # warm-up
    times: dict[str, list[float]] = {"module": [], "evidence": []}
    for _ in range(4):
        for name, on in (("module", False), ("evidence", True)):
            t0 = time.perf_counter()
            run(on)
            times[name].append(time.perf_counter() - t0)
    pairs = [e / m for e, m in zip(times["evidence"], times["module"], strict=True)]
    print(
        json.dumps(
            {
                "prompt_tokens": prompt.num_tokens,
                "seconds": times,
                "evidence_over_module_per_pair": pairs,
                "median_ratio": statistics.median(pairs),
            }
        )
    )


if __name__ == "__main__":
    main()
