"""Checked answers' support: the rows (`run`), and the held-out measurements (`report`) of docs/results/check/README.md.

    python docs/results/check/support.py run --reader smollm2-135m --dataset hotpotqa --split train --n 50
    python docs/results/check/support.py fit --reader smollm2-135m   # train runs -> generators/trained/support-checked/
    python docs/results/check/support.py report

`run` checks each unit's answer with `Pipeline.check` (eval/check_support.py) and appends one row per unit to
docs/results/check/runs/<reader>/<dataset>[-train]/ (resumable: a rerun skips the rows written). `report` fits
nothing: it reads the shipped checked support models (generators/trained/support-checked/) and the held-out rows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run")
    run.add_argument("--reader", default="smollm2-135m")
    run.add_argument("--dataset", default="hotpotqa")
    run.add_argument("--split", default="eval")
    run.add_argument("--n", type=int, default=40)
    run.add_argument(
        "--kinds",
        default=None,
        help="comma-separated; default: train other,gold,wrong,planted; eval other,gemma,planted (own: read from the "
        "support runs, docs/results/check/report.py)",
    )
    run.add_argument("--limit", type=int, default=None)
    fit = sub.add_parser("fit")
    fit.add_argument("--reader", default="smollm2-135m")
    sub.add_parser("report")
    args = parser.parse_args()
    if args.command == "run":
        from midlens.eval.check_support import TRAIN_KINDS, CheckRunOptions
        from midlens.eval.check_support import run as run_units

        kinds = (
            args.kinds.split(",")
            if args.kinds
            else (list(TRAIN_KINDS) if args.split == "train" else ["other", "gemma", "planted"])
        )
        if args.dataset == "kv":
            kinds = [k for k in kinds if k != "planted"]  # a key-value passage has one sentence
        name = args.dataset if args.split == "eval" else f"{args.dataset}-{args.split}"
        out = RUNS / args.reader / name
        run_units(CheckRunOptions(out, args.reader, args.dataset, args.split, args.n, tuple(kinds), limit=args.limit))
    elif args.command == "fit":
        from midlens.eval.check_support import fit_and_save

        runs = sorted((RUNS / args.reader).glob("*-train"))
        print(fit_and_save(runs))
    else:
        from report import report  # docs/results/check/report.py

        report(RUNS, HERE)


if __name__ == "__main__":
    main()
