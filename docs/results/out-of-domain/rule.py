"""The answering-default rule (eval/report/default_rule.py) on each packaged model's committed n = 200 sweeps, with
each method's paired numbers per corpus. The rule judges a trained method only on corpora outside its training data
(read from its shipped artefacts' metadata: every one was trained on HotpotQA's train split), so those rows are
printed beside the decision, not in it.

    python docs/results/out-of-domain/rule.py docs/results/smollm2-135m/short-answer/runs,docs/results/restack/...

Each argument is one model's folders, comma-separated; a folder holds one folder per corpus (hotpotqa, squad), each
a run folder or a folder of run folders (one per group of methods).
"""

from __future__ import annotations

import sys
from pathlib import Path

from midlens.eval.report.default_rule import CORPORA, chosen, judge
from midlens.eval.report.load import load_runs
from midlens.eval.report.summarise import sweep_summary


def main(models: list[str]) -> None:
    for folders in models:
        runs = sorted({f.parent for d in folders.split(",") for c in CORPORA for f in Path(d, c).rglob("config.json")})
        _configs, rows = load_runs(runs)
        verdicts = judge(rows)
        tables = {c: t for label, t in sweep_summary(rows).items() for c in CORPORA if label.startswith(c)}
        print(f"## {folders}")
        for v in sorted(verdicts or [], key=lambda v: v.method):
            for corpus, t in tables.items():
                if v.method not in t["paired"]:
                    print(f"  {v.method} {corpus}: no rows")
                    continue
                em, (em_low, em_high) = t["paired"][v.method]["em"]
                f1, (f1_low, f1_high) = t["paired"][v.method]["f1"]
                below = [p for p in t["positions"] if t["methods"][v.method]["positions"][p]["em"]
                         < t["methods"]["baseline"]["positions"][p]["em"]]  # fmt: skip
                aside = " (in-domain, beside the decision)" if corpus in v.in_domain else ""
                print(f"  {v.method} {corpus}, n = {t['n']}{aside}: EM {100 * em:+.1f} [{100 * em_low:+.1f}, "
                      f"{100 * em_high:+.1f}], F1 {100 * f1:+.1f} [{100 * f1_low:+.1f}, {100 * f1_high:+.1f}], "
                      f"below baseline at gold@{below or 'none'}")  # fmt: skip
            print(f"  -> {v.method}: {'passes' if v.passes else 'fails: ' + '; '.join(v.reasons)}")
        print(f"  default supported: {chosen(verdicts) if verdicts else 'baseline (no verdict: a corpus is missing)'}")


if __name__ == "__main__":
    main(sys.argv[1:])
