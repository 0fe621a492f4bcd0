"""`midlens eval support` and `midlens eval support-report`: answers with their support inputs and correctness
(midlens.eval.support), then how well a support model separates right from wrong answers (midlens.eval.support_report).

midlens eval support --dataset hotpotqa --split train --n 60 --out runs/support/hotpotqa-train   # fit on this
midlens eval support-fit runs/support/hotpotqa-train runs/support/squad-train
midlens eval support --dataset squad --n 70 --out runs/support/squad                            # measure here
midlens eval support-report runs/support/squad --out docs/results/support/qwen2.5-coder-0.5b
"""

from __future__ import annotations

import argparse
from pathlib import Path

from midlens.cli.options import add_device_args, positive_int
from midlens.core.defaults import EVAL_MODEL

EXAMPLES = """examples:
  midlens eval support --dataset hotpotqa --split train --n 60 --out runs/support/hotpotqa-train
  midlens eval support --dataset kv --n 70 --model smollm2-135m --out runs/support/kv-smol
  midlens eval support-report runs/support/hotpotqa runs/support/squad --out report/
"""


def add_parsers(esub) -> None:
    sp = esub.add_parser(
        "support", help="answers as a user gets them, with their support inputs and correctness", epilog=EXAMPLES
    )
    sp.add_argument("--out", required=True, type=Path, help="run directory (created; resumed when it exists)")
    sp.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    sp.add_argument(
        "--method", help="the answering method's spec (e.g. baseline, \"ms-poe(ratio_max=1.5)\"); default: the model's"
    )
    add_device_args(sp)
    sp.add_argument("--dataset", choices=("hotpotqa", "squad", "kv"), default="hotpotqa")
    sp.add_argument("--split", choices=("train", "eval"), default="eval", help="fit on train, measure on eval")
    sp.add_argument("--n", type=positive_int, default=70, help="questions (seeded subsample); x 3 gold slots")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max-words", type=positive_int, default=60, help="words kept per passage")
    sp.add_argument("--no-verify", dest="verify", action="store_false", help="skip the citations' ablation check")
    sp.add_argument("--limit", type=positive_int, help="stop after this many new answers (resume later)")
    sp.add_argument("--shard", default="0/1", help="I/N: every N-th question from the I-th (one process per core)")
    sp.set_defaults(func=run)

    fp = esub.add_parser(
        "support-fit",
        help="fit the support models (plain and verified) on train-split `eval support` runs",
    )
    fp.add_argument("runs", nargs="+", type=Path, help="train-split runs: one model's (its own) or several (`any`)")
    fp.add_argument("--out", type=Path, help="folder for the two artefacts (default: the shipped folders)")
    fp.set_defaults(func=fit)

    rp = esub.add_parser("support-report", help="AUROC, calibration and selective answering of support models")
    rp.add_argument("runs", nargs="+", type=Path, help="held-out `eval support` run directories")
    rp.add_argument("--out", required=True, type=Path, help="folder for report.md, report.json and the PNGs")
    rp.add_argument("--train", type=Path, nargs="*", default=[], help="the train runs the models were fitted on")
    rp.set_defaults(func=report)


def run(args: argparse.Namespace) -> int:
    from midlens.eval.runner import parse_shard
    from midlens.eval.support import SupportRunOptions, run

    options = SupportRunOptions(
        out=args.out,
        dataset=args.dataset,
        split=args.split,
        model=args.model,
        method=args.method,
        device=args.device,
        dtype=args.dtype,
        n=args.n,
        seed=args.seed,
        max_words=args.max_words,
        verify=args.verify,
        limit=args.limit,
        shard=parse_shard(args.shard),
    )
    rows = run(options)
    right = sum(r["em"] for r in rows)
    print(f"{len(rows)} answers in {args.out}, {right:.0f} right (EM)")
    return 0


def report(args: argparse.Namespace) -> int:
    from midlens.eval.support_report import write_report

    path = write_report(args.runs, args.out, args.train)
    print(f"wrote {path}")
    return 0


def fit(args: argparse.Namespace) -> int:
    from midlens.eval.support import read_run
    from midlens.training.support import fit_and_save

    for path in fit_and_save(args.runs, [read_run(r) for r in args.runs], args.out):
        print(f"wrote {path}")
    return 0
