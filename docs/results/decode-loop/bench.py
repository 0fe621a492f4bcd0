"""The decode loop's text, linear against quadratic: one process, one thread, the same prompts.

`python docs/results/decode-loop/bench.py --model smollm2-135m --tokens 256 --batches 8,32` answers a batch of B
copies of prompts with ignore_eos (every row decodes exactly --tokens tokens), alternating the loop as shipped
(`IncrementalText`, a few tokens decoded per step) with the loop as it was (the whole answer decoded every step,
patched in), and reports the median seconds of each and their ratio; plus the text step alone (no model) for the
same rows and lengths. Writes results.json beside this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from midlens.core.passage import Passage
from midlens.generators import Generator, load_model
from midlens.generators.answering import detokenize


class WholeAnswer:
    """The loop before: every step decodes the whole answer so far."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids = tokenizer, []

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)


def text_only(tokenizer, ids: list[int], rows: int, cls) -> float:
    t0 = time.perf_counter()
    for _ in range(rows):
        text = cls(tokenizer)
        for token in ids:
            text.push(token)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(args.model, "cpu", "float32")
    gen = Generator(loaded, method="baseline", citations=None)
    passages = [Passage(text="Wim Wenders directed Wings of Desire in 1987, set in Berlin.", title="Wings of Desire")]
    prompt = gen.prompt("Describe the film at length.", passages)
    answer_ids = gen.generate(prompt, max_new_tokens=args.tokens, ignore_eos=True).answer_ids
    shipped = detokenize.IncrementalText
    out = {"model": args.model, "tokens": args.tokens, "threads": 1, "dtype": "float32", "rows": []}
    for batch in [int(b) for b in args.batches.split(",")]:
        times = {"linear": [], "whole": []}
        text = {"linear": [], "whole": []}
        for _ in range(args.repeats):
            for name, cls in (("linear", shipped), ("whole", WholeAnswer)):
                detokenize.IncrementalText = cls  # the generator module reads the name it imported:
                import midlens.generators.answering.generator as g

                g.IncrementalText = cls
                t0 = time.perf_counter()
                gen.generate_batch([prompt] * batch, max_new_tokens=args.tokens, ignore_eos=True)
                times[name].append(time.perf_counter() - t0)
                text[name].append(text_only(loaded.tokenizer, answer_ids, batch, cls))
        g.IncrementalText = detokenize.IncrementalText = shipped
        row = {
            "batch": batch,
            "answer_s_linear": statistics.median(times["linear"]),
            "answer_s_whole": statistics.median(times["whole"]),
            "text_s_linear": statistics.median(text["linear"]),
            "text_s_whole": statistics.median(text["whole"]),
        }
        row["answer_ratio_whole_over_linear"] = row["answer_s_whole"] / row["answer_s_linear"]
        row["text_ratio_whole_over_linear"] = row["text_s_whole"] / row["text_s_linear"]
        out["rows"].append(row)
        print(json.dumps(row))
    Path(__file__).with_name("results.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
