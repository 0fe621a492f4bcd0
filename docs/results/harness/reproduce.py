"""Does lm-evaluation-harness, running midlens as its model (`--model midlens`, task midlens_mdqa), reproduce a
committed position sweep? Per question: the harness's answer against the sweep row's, and EM.

    python docs/results/harness/reproduce.py --limit 40 --out docs/results/harness/reproduce.json

The sweep: docs/results/smollm2-135m/short-answer/runs/hotpotqa (SmolLM2, HotpotQA eval split, n = 200, seed 0,
K = 10, 60 words, short instruction, 16 tokens, fp32). The harness reads the same examples (eval/harness_tasks/
utils.py) and `--limit` takes the first of them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import lm_eval
from lm_eval.tasks import TaskManager

import midlens.eval.harness as harness

ROOT = Path(__file__).resolve().parents[3]
SWEEP = ROOT / "docs/results/smollm2-135m/short-answer/runs/hotpotqa/results.jsonl.gz"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--methods", default="baseline,finetuned")
    ap.add_argument("--positions", default="1,5,10")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = [json.loads(line) for line in gzip.open(SWEEP, "rt")]
    spec = {"baseline": "baseline", "finetuned": "mudaf(alpha=0)"}
    report = {"sweep": str(SWEEP.relative_to(ROOT)), "limit": args.limit, "cells": []}
    for method in args.methods.split(","):
        lm = harness.MidlensLM("smollm2-135m", method=method, device="cpu", dtype="float32")
        for position in map(int, args.positions.split(",")):
            t0 = time.perf_counter()
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=["midlens_mdqa"],
                # The task's data settings go to the TaskManager that builds it (simple_evaluate's own `metadata`
                # reaches only a manager it makes itself).
                task_manager=TaskManager(include_path=str(harness.TASKS), metadata={"position": position}),
                limit=args.limit,
                log_samples=True,
            )
            samples = out["samples"]["midlens_mdqa"]
            swept = {r["example"]: r for r in rows if r["method"] == spec[method] and r["position"] == position}
            same = sum(s["filtered_resps"][0].strip() == swept[s["doc_id"]]["prediction"] for s in samples)
            cell = {
                "method": method,
                "position": position,
                "questions": len(samples),
                "identical_answers": same,
                "harness_em": sum(s["em"] for s in samples) / len(samples),
                "sweep_em": sum(swept[s["doc_id"]]["em"] for s in samples) / len(samples),
                "harness_f1": sum(s["f1"] for s in samples) / len(samples),
                "sweep_f1": sum(swept[s["doc_id"]]["f1"] for s in samples) / len(samples),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            report["cells"].append(cell)
            print(json.dumps(cell), flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
