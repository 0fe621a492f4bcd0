"""Checked answers' support: the rows (`run`), and the held-out measurements (`report`) of docs/results/check/README.md.

    python docs/results/check/support.py run --reader smollm2-135m --dataset hotpotqa --split train --n 50
    python docs/results/check/support.py run --reader smollm2-135m --answers SWEEP_FOLDER   # another model's answers
    python docs/results/check/support.py fit --reader smollm2-135m   # train runs -> generators/trained/support-checked/
    python docs/results/check/support.py report

`run` checks each unit's answer with `Pipeline.check` (eval/check_support.py), the reader teacher-forcing with its
base model, and appends one row per unit to docs/results/check/runs-base/<reader>/<dataset>[-train]/, or
<corpus>-by-<writer>/ for a sweep's answers (resumable: a rerun skips the rows written). runs/ holds the rows read by
the fine-tunes, the answering default they were taken under. `report` fits
nothing: it reads the shipped checked support models (generators/trained/support-checked/) and the held-out rows
(sentences.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs-base"


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
    run.add_argument("--reader-method", default="baseline", help="the method the reader teacher-forces with")
    run.add_argument("--verify", action="store_true", help="check each cited passage by ablation (VERIFY_FEATURES)")
    run.add_argument("--answers", type=Path, nargs="*", default=[], help="eval sweep folders whose answers to check")
    run.add_argument("--answers-data", type=Path, default=None, help="the JSONL file a sweep over one read")
    run.add_argument("--answer-methods", default="baseline")
    run.add_argument("--answers-n", type=int, default=40, help="the first N questions of each sweep (x its slots)")
    run.add_argument("--name", default=None, help="the run folder's name (default: the corpus, or CORPUS-by-WRITER)")
    run.add_argument("--limit", type=int, default=None)
    run.add_argument("--no-progress", action="store_true", help="no progress bar (a log file)")
    fit = sub.add_parser("fit")
    fit.add_argument("--reader", default="smollm2-135m")
    sub.add_parser("report")
    args = parser.parse_args()
    if args.command == "run":
        from midlens.eval.check_support import TRAIN_KINDS, CheckRunOptions
        from midlens.eval.check_support import run as run_units

        if args.answers:
            kinds = ["sweep"] + (args.kinds.split(",") if args.kinds else [])
        else:
            kinds = (
                args.kinds.split(",")
                if args.kinds
                else (list(TRAIN_KINDS) if args.split == "train" else ["other", "gemma", "planted"])
            )
        if args.dataset == "kv":
            kinds = [k for k in kinds if k != "planted"]  # a key-value passage has one sentence
        name = args.name or (args.dataset if args.split == "eval" else f"{args.dataset}-{args.split}")
        out = RUNS / args.reader / name
        options = CheckRunOptions(
            out,
            args.reader,
            dataset=args.dataset,
            split=args.split,
            n=args.n,
            kinds=tuple(kinds),
            limit=args.limit,
            reader_method=args.reader_method,
            verify=args.verify,
            answers=tuple(args.answers),
            answer_methods=tuple(args.answer_methods.split(",")),
            answers_n=args.answers_n,
            answers_data=args.answers_data,
            progress=not args.no_progress,
        )
        run_units(options)
    elif args.command == "fit":
        from midlens.eval.check_support import fit_and_save

        runs = sorted((RUNS / args.reader).glob("*-train"))
        print(fit_and_save(runs))
    else:
        from sentences import main as report  # docs/results/check/sentences.py: the shipped models, held out

        report()


if __name__ == "__main__":
    main()
