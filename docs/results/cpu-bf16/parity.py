"""bf16 against fp32 on the CPU, row by row: the committed fp32 short-instruction sweeps and bf16 rows of the same
units (same data hash, prompts, methods, decoding), n = the first 100 questions of each.

    python docs/results/cpu-bf16/parity.py            # reads runs/ below this folder, writes parity.md and parity.json

Per model x corpus x method: the paired EM and F1 difference (bf16 - fp32, points; 95 % bootstrap over questions,
each question's three gold slots averaged), the share of identical answer texts, the share of prompts whose gold
passage got the same evidence rank, and the gold answer's log-probability difference (nats).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from midlens.eval.metrics import bootstrap_ci
from midlens.eval.runner import read_rows

HERE = Path(__file__).parent
RESULTS = HERE.parents[1] / "results"
SOURCES = {  # (model, corpus): (committed fp32 run, bf16 run of the same config but dtype)
    ("qwen2.5-coder-0.5b", "hotpotqa"): ("qwen2.5-coder-0.5b/short-answer/runs/hotpotqa", "runs/hotpotqa-qwen"),
    ("qwen2.5-coder-0.5b", "squad"): ("qwen2.5-coder-0.5b/short-answer/runs/squad", "runs/squad-qwen"),
    ("smollm2-135m", "hotpotqa"): ("smollm2-135m/short-answer/runs/hotpotqa", "runs/hotpotqa-smol"),
    ("smollm2-135m", "squad"): ("smollm2-135m/short-answer/runs/squad", "runs/squad-smol"),
}
NAMES = {"mudaf(alpha=0)": "finetuned (default)", "baseline": "baseline"}


def _rows(folder: Path) -> dict[str, dict]:
    rows = read_rows(folder / "results.jsonl.gz") or read_rows(folder / "results.jsonl")
    return {r["key"]: r for r in rows}


def compare(fp32: dict[str, dict], bf16: dict[str, dict], method: str) -> dict | None:
    keys = [k for k, r in bf16.items() if r["method"] == method and k in fp32]
    if not keys:
        return None
    by_question: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for k in keys:
        by_question[bf16[k]["example_id"]].append((fp32[k], bf16[k]))
    out = {"questions": len(by_question), "units": len(keys)}
    for metric in ("em", "f1"):
        diffs = [100 * statistics.mean(b[metric] - a[metric] for a, b in pairs) for pairs in by_question.values()]
        low, high = bootstrap_ci(diffs)
        out[metric] = {
            "fp32": 100 * statistics.mean(fp32[k][metric] for k in keys),
            "bf16": 100 * statistics.mean(bf16[k][metric] for k in keys),
            "diff": statistics.mean(diffs),
            "low": low,
            "high": high,
        }
    out["same_text"] = statistics.mean(fp32[k]["prediction"] == bf16[k]["prediction"] for k in keys)
    out["same_gold_rank"] = statistics.mean(fp32[k]["gold_rank"] == bf16[k]["gold_rank"] for k in keys)
    lp = [bf16[k]["logprob"] - fp32[k]["logprob"] for k in keys if fp32[k].get("logprob") is not None]
    out["logprob_diff"] = statistics.mean(lp) if lp else None
    out["logprob_abs_diff_median"] = statistics.median(abs(x) for x in lp) if lp else None
    return out


def main() -> None:
    report = {}
    lines = [
        "| model | corpus | method | questions | EM fp32 / bf16 | paired EM, points | F1 fp32 / bf16 "
        "| paired F1, points | same text | same gold rank | gold log-prob diff (mean / median abs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (model, corpus), (committed, ours) in SOURCES.items():
        if not (HERE / ours).exists():
            continue
        fp32, bf16 = _rows(RESULTS / committed), _rows(HERE / ours)
        for method in ("baseline", "mudaf(alpha=0)"):
            c = compare(fp32, bf16, method)
            if c is None:
                continue
            report[f"{model}|{corpus}|{method}"] = c
            em, f1 = c["em"], c["f1"]
            lines.append(
                f"| {model} | {corpus} | {NAMES[method]} | {c['questions']} | {em['fp32']:.1f} / {em['bf16']:.1f} | "
                f"{em['diff']:+.1f} [{em['low']:+.1f}, {em['high']:+.1f}] | {f1['fp32']:.1f} / {f1['bf16']:.1f} | "
                f"{f1['diff']:+.1f} [{f1['low']:+.1f}, {f1['high']:+.1f}] | {100 * c['same_text']:.0f} % | "
                f"{100 * c['same_gold_rank']:.0f} % | {c['logprob_diff']:+.3f} / {c['logprob_abs_diff_median']:.3f} |"
            )
    (HERE / "parity.json").write_text(json.dumps(report, indent=2) + "\n")
    (HERE / "parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
