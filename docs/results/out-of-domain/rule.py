"""The answering-default rule (eval/report/default_rule.py) re-read with a trained method judged only on corpora
outside its training data: every shipped delta trained on HotpotQA's train split, so its HotpotQA rows are
in-domain and printed beside the decision, not in it. Training-free methods keep both corpora.

    python docs/results/out-of-domain/rule.py docs/results/smollm2-135m/short-answer/runs \
        docs/results/qwen2.5-coder-0.5b/short-answer/runs
"""

from __future__ import annotations

import sys
from pathlib import Path

from midlens.eval.report.summarise import sweep_summary
from midlens.eval.runner import read_rows

# Their shipped artefacts trained on HotpotQA's train split; channel-scaling's searched choice was ranked on
# HotpotQA train-split prompts (and synthetic KV), so HotpotQA is in-domain for it too. `finetuned` is mudaf(alpha=0).
TRAINED = ("mudaf", "moice", "pos2distill", "finetuned", "channel-scaling")
IN_DOMAIN = {"hotpotqa"}


def main(folders: list[str]) -> None:
    for folder in folders:
        # A corpus folder holds one run's rows, or one run folder per method (runs that each finish whole).
        files = [f for c in ("hotpotqa", "squad") for f in sorted((Path(folder) / c).rglob("results.jsonl*"))]
        rows = [r for f in files for r in read_rows(f)]
        tables = {label.split(" ")[0].split("-")[0]: t for label, t in sweep_summary(rows, "baseline").items()}
        print(f"## {folder}")
        for method in sorted({m for t in tables.values() for m in t["paired"]}):
            trained = method.split("(")[0] in TRAINED
            reasons = []
            for corpus in ("hotpotqa", "squad"):
                aside = trained and corpus in IN_DOMAIN
                t = tables.get(corpus)
                if t is None or method not in t["paired"]:  # a rule needs its corpus measured, not assumed
                    print(f"  {method} {corpus}: no rows")
                    reasons += [] if aside else [f"{corpus} not run"]
                    continue
                em, (em_low, em_high) = t["paired"][method]["em"]
                f1, (f1_low, f1_high) = t["paired"][method]["f1"]
                below = [p for p in t["positions"] if t["methods"][method]["positions"][p]["em"]
                         < t["methods"]["baseline"]["positions"][p]["em"]]  # fmt: skip
                where = f"{corpus}, n = {t['n']}{' (in-domain, beside the decision)' if aside else ''}"
                print(f"  {method} {where}: EM {100 * em:+.1f} [{100 * em_low:+.1f}, {100 * em_high:+.1f}], "
                      f"F1 {100 * f1:+.1f} [{100 * f1_low:+.1f}, {100 * f1_high:+.1f}], "
                      f"below baseline at gold@{below or 'none'}")  # fmt: skip
                if aside:
                    continue
                reasons += [f"{corpus} EM" for low in (em_low,) if not low > 0]
                reasons += [f"{corpus} F1" for low in (f1_low,) if not low > 0]
                reasons += [f"{corpus} gold@{p}" for p in below]
            print(f"  -> {method}: {'passes' if not reasons else 'fails: ' + ', '.join(reasons)}")


if __name__ == "__main__":
    main(sys.argv[1:])
