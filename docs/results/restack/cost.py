"""What restacking costs per answer: a method answering alone against the same method answering passages restacked
by a scorer's evidence, on the same HotpotQA eval-split prompts (10 paragraphs, short instruction).

    OMP_NUM_THREADS=1 python docs/results/restack/cost.py --model smollm2-135m --method finetuned --n 8 \
        --out docs/results/restack/cost-smollm2-finetuned.json

Time: the two systems alternate prompt by prompt in one process (after one warm-up answer each), batch size 1, and
the ratio of their summed times is reported. Peak memory: each system answers the same prompts in a fresh process
of its own (after its warm-up answer, which loads every part); the kernel's peak is reset then (eval.memory) and
read after the last answer: the peak resident memory (weights included) and its growth over what was resident at
the reset (the answering's working memory), each as a ratio between the two systems.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def answerer(model: str, method: str, scorer: str | None):
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.restack import Restack, Restacker
    from midlens.generators.models.loading import load_model

    generator = Generator(load_model(model), method=method)
    return generator if scorer is None else Restacker(generator, Restack(scorer))


def prompts(answering, n: int, max_new_tokens: int) -> list:
    from midlens.eval.datasets import load_hotpotqa

    examples = load_hotpotqa(n, 0, mode="mdqa", k=10, max_words=60, split="eval")
    return [answering.prompt(e.question, e.passages, max_new_tokens=max_new_tokens, style="short") for e in examples]


def peak_rss(args: argparse.Namespace, scorer: str | None) -> dict[str, float]:
    """{"peak_kib", "growth_kib"} of a fresh process that answers the prompts with one system."""
    cmd = [sys.executable, __file__, "--model", args.model, "--method", args.method, "--n", str(args.n)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--only", scorer or "none"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--method", default="finetuned")
    ap.add_argument("--scorer", default="mudaf")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--only", help=argparse.SUPPRESS)  # the memory subprocess: one system, print peak RSS
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.only is not None:
        from midlens.eval.memory import current_kb, peak_kb, reset_peak

        system = answerer(args.model, args.method, None if args.only == "none" else args.only)
        todo = prompts(system, args.n, args.max_new_tokens)
        system.generate(todo[0], max_new_tokens=args.max_new_tokens, stop_at_line_end=True)  # every part loaded
        if not reset_peak():
            raise SystemExit("this kernel does not reset the peak (/proc/self/clear_refs): no memory figure")
        before = current_kb()
        for prompt in todo:
            system.generate(prompt, max_new_tokens=args.max_new_tokens, stop_at_line_end=True)
        peak = peak_kb()
        print(json.dumps({"peak_kib": peak, "growth_kib": peak - before}))
        return
    from tqdm import tqdm

    plain = answerer(args.model, args.method, None)
    restacked = answerer(args.model, args.method, args.scorer)
    todo = prompts(plain, args.n, args.max_new_tokens)
    options = {"max_new_tokens": args.max_new_tokens, "stop_at_line_end": True}
    for system in (plain, restacked):
        system.generate(todo[0], **options)  # warm-up
    seconds = {"plain": 0.0, "restacked": 0.0}
    tokens = {"plain": 0, "restacked": 0}
    for prompt in tqdm(todo, desc="alternating"):
        for name, system in (("plain", plain), ("restacked", restacked)):
            t0 = time.perf_counter()
            answer = system.generate(prompt, **options)
            seconds[name] += time.perf_counter() - t0
            tokens[name] += answer.generated_tokens
    rss = {"plain": peak_rss(args, None), "restacked": peak_rss(args, args.scorer)}
    record = {
        "model": args.model,
        "method": args.method,
        "scorer": args.scorer,
        "prompts": len(todo),
        "prompt_tokens_mean": sum(len(p.input_ids) for p in todo) / len(todo),
        "max_new_tokens": args.max_new_tokens,
        "seconds": seconds,
        "generated_tokens": tokens,
        "time_ratio": seconds["restacked"] / seconds["plain"],
        "memory_kib": rss,
        "peak_rss_ratio": rss["restacked"]["peak_kib"] / rss["plain"]["peak_kib"],
        "working_memory_ratio": rss["restacked"]["growth_kib"] / max(rss["plain"]["growth_kib"], 1.0),
        "command": " ".join(sys.argv),
    }
    text = json.dumps(record, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
