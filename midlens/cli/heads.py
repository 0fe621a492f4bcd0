"""`midlens heads score`: the retrieval-head score (F1/EM, MuDAF's criterion) of every head of a model.

midlens heads score --model smollm2-135m --n 200 --out runs/heads
"""

from __future__ import annotations

import argparse
from pathlib import Path

from midlens.cli.options import add_device_args, check_device, positive_int
from midlens.core.defaults import EVAL_MODEL


def add_parser(sub) -> None:
    heads = sub.add_parser("heads", help="retrieval-head scores (MuDAF) of a model")
    hsub = heads.add_subparsers(dest="heads_command", required=True)
    score = hsub.add_parser("score", help="F1/EM retrieval score of every head on HotpotQA train prompts")
    score.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    score.add_argument("--method", default="baseline", help="method spec to score (e.g. mudaf, to compare)")
    score.add_argument("--n", type=positive_int, default=200, help="number of prompts (train split)")
    score.add_argument("--seed", type=int, default=1, help="prompt selection seed")
    score.add_argument("--eps", type=float, default=0.3, help="attention mass that makes a passage 'attended'")
    score.add_argument("--max-words", type=int, default=80)
    score.add_argument("--out", type=Path, default=Path("runs/heads"), help="folder for <name>.json and .png")
    score.add_argument("--name", help="file name stem (default: the model name)")
    add_device_args(score)
    score.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from midlens.generators import Generator, load_model
    from midlens.training.data import training_examples
    from midlens.training.heads import heatmap, retrieval_head_scores, save_scores

    check_device(args)
    loaded = load_model(args.model, args.device, args.dtype)
    gen = Generator(loaded, method=args.method)
    examples = training_examples(loaded.tokenizer, args.n, seed=args.seed, max_words=args.max_words)
    scores = retrieval_head_scores(gen, examples, eps=args.eps)
    scores.update(split="train", seed=args.seed, max_words=args.max_words)
    stem = args.name or Path(args.model).name
    save_scores(scores, args.out / f"{stem}.json")
    heatmap(scores, args.out / f"{stem}.png")
    best = sorted(((s, (lay, h)) for lay, row in enumerate(scores["f1"]) for h, s in enumerate(row)), reverse=True)
    print("top heads (layer, head): F1 " + ", ".join(f"{h}: {s:.3f}" for s, h in best[:8]))
    print(f"scores in {args.out / (stem + '.json')}, heatmap {args.out / (stem + '.png')}")
    return 0
