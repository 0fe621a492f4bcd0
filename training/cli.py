"""`midlens heads score` and `midlens train mudaf`: thin shells over training.heads and training.mudaf.

midlens heads score --model smollm2-135m --n 200 --out runs/heads
midlens train mudaf --model smollm2-135m --examples 4000 --out runs/mudaf-smollm2
midlens train mudaf --model smollm2-135m --alpha 0 --out runs/sft-smollm2          # plain fine-tuning
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from core.errors import MidlensError


def add_heads_parser(sub) -> None:
    from rag.options import add_device_args

    heads = sub.add_parser("heads", help="retrieval-head scores (MuDAF) of a model")
    hsub = heads.add_subparsers(dest="heads_command", required=True)
    score = hsub.add_parser("score", help="F1/EM retrieval score of every head on HotpotQA train prompts")
    score.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    score.add_argument("--method", default="baseline", help="method spec to score (e.g. mudaf, to compare)")
    score.add_argument("--n", type=int, default=200, help="number of prompts (train split)")
    score.add_argument("--seed", type=int, default=1, help="prompt selection seed")
    score.add_argument("--eps", type=float, default=0.3, help="attention mass that makes a passage 'attended'")
    score.add_argument("--max-words", type=int, default=80)
    score.add_argument("--out", type=Path, default=Path("runs/heads"), help="folder for <name>.json and .png")
    score.add_argument("--name", help="file name stem (default: the model name)")
    add_device_args(score)
    score.set_defaults(func=cmd_heads_score)


def add_train_parser(sub) -> None:
    from rag.options import add_device_args

    tr = sub.add_parser("train", help="train a method's artefact (MuDAF LoRA delta)")
    tsub = tr.add_subparsers(dest="train_command", required=True)
    mu = tsub.add_parser("mudaf", help="contrastive tuning of retrieval heads (alpha=0: plain fine-tuning)")
    mu.add_argument("--model", default="smollm2-135m", help="registry name or local HF folder")
    mu.add_argument("--out", type=Path, required=True, help="artefact folder to write (checkpoints beside it)")
    mu.add_argument("--examples", type=int, default=4000, help="training examples consumed (train split)")
    mu.add_argument("--batch", type=int, default=8, help="examples per optimizer step (gradient accumulation)")
    mu.add_argument("--lr", type=float, default=2e-4)
    mu.add_argument("--warmup", type=float, default=0.05)
    mu.add_argument("--alpha", type=float, default=0.7, help="weight of the contrastive loss (0 = plain SFT)")
    mu.add_argument("--tau", type=float, default=0.05)
    mu.add_argument("--rank", type=int, default=16)
    mu.add_argument("--lora-layers", default="all", choices=["all", "targets"])
    mu.add_argument("--num-heads", type=int, default=8, help="target heads")
    mu.add_argument("--head-selection", default="sample", choices=["sample", "top"])
    mu.add_argument("--heads-file", type=Path, help="scores from `midlens heads score` (default: computed first)")
    mu.add_argument("--heads-n", type=int, default=200, help="prompts for the head scores when computed here")
    mu.add_argument("--max-words", type=int, default=80)
    mu.add_argument("--seed", type=int, default=0)
    mu.add_argument("--max-minutes", type=float, help="stop (checkpointed, artefact saved) after this much training")
    mu.add_argument("--no-progress", action="store_true")
    add_device_args(mu)
    mu.set_defaults(func=cmd_train_mudaf)


def _positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise MidlensError(f"--{name} {value}: must be positive.")


def cmd_heads_score(args: argparse.Namespace) -> int:
    from generators import Generator, load_model
    from rag.options import check_device
    from training.data import training_examples
    from training.heads import heatmap, retrieval_head_scores, save_scores

    _positive("n", args.n)
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


def cmd_train_mudaf(args: argparse.Namespace) -> int:
    from generators import Generator, load_model
    from generators.retrieval_heads import select_heads
    from rag.options import check_device
    from training.data import training_examples
    from training.heads import retrieval_head_scores, save_scores
    from training.loop import LoopConfig
    from training.mudaf import MudafConfig, data_record, train_mudaf

    for name in ("examples", "batch", "lr", "rank", "num_heads", "heads_n", "tau"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if not 0 <= args.alpha <= 1:
        raise MidlensError(f"--alpha {args.alpha}: the contrastive weight is in [0, 1].")
    check_device(args)
    loaded = load_model(args.model, args.device, args.dtype)
    if args.heads_file:
        if not args.heads_file.is_file():
            raise MidlensError(f"--heads-file {args.heads_file}: no such file; make it with `midlens heads score`.")
        scores = json.loads(args.heads_file.read_text())
        if scores.get("model_sha256") != loaded.sha256:
            raise MidlensError(f"--heads-file {args.heads_file} scores another model than {args.model}.")
    else:
        probe = training_examples(loaded.tokenizer, args.heads_n, seed=args.seed + 1, max_words=args.max_words)
        scores = retrieval_head_scores(Generator(loaded), probe, progress=not args.no_progress)
        save_scores(scores, args.out.with_name(args.out.name + ".heads.json"))
    heads = select_heads(
        scores["f1"], args.num_heads, seed=args.seed, mode=args.head_selection, tiebreak=scores.get("em")
    )
    examples = training_examples(loaded.tokenizer, args.examples, seed=args.seed, max_words=args.max_words)
    config = MudafConfig(tuple(heads), args.alpha, args.tau, args.rank, 2.0 * args.rank, lora_layers=args.lora_layers)
    loop = LoopConfig(len(examples), args.batch, args.lr, args.warmup, seed=args.seed)
    result = train_mudaf(
        loaded,
        examples,
        config,
        loop,
        str(args.out),
        data_record(examples, args.seed, args.max_words),
        scores,
        progress=not args.no_progress,
        max_seconds=None if args.max_minutes is None else 60 * args.max_minutes,
    )
    t = result["meta"]["training"]
    print(
        f"trained {result['meta']['delta']['parameters']:,} delta parameters on {t['examples_seen']} examples in "
        f"{t['seconds']:.0f} s; loss {t['loss_first_10']:.3f} -> {t['loss_last_10']:.3f}; artefact {args.out}"
    )
    return 0
