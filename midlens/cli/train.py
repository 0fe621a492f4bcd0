"""`midlens train mudaf|moice`: train a method's artefact, a thin shell over training/.

midlens train mudaf --model smollm2-135m --examples 4000 --out runs/mudaf-smollm2
midlens train mudaf --model smollm2-135m --alpha 0 --out runs/sft-smollm2          # plain fine-tuning
midlens train moice --model smollm2-135m --examples 600 --out runs/moice-smollm2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.names import EVAL_MODEL


def _add_training_args(
    parser,
    examples: int,
    lr: float,
    warmup: float,
    max_words: int,
    lr_help: str | None = None,
    warmup_help: str = "fraction of steps",
) -> None:
    """The options every `midlens train` command shares; each method passes its own defaults."""
    from midlens.cli.options import add_device_args, positive_int

    parser.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    parser.add_argument("--out", type=Path, required=True, help="artefact folder to write (checkpoints beside it)")
    parser.add_argument(
        "--examples", type=positive_int, default=examples, help="training examples consumed (train split)"
    )
    parser.add_argument(
        "--batch", type=positive_int, default=8, help="examples per optimizer step (gradient accumulation)"
    )
    parser.add_argument("--lr", type=float, default=lr, help=lr_help)
    parser.add_argument("--warmup", type=float, default=warmup, help=warmup_help)
    parser.add_argument("--max-words", type=int, default=max_words, help="clip paragraphs to ~N words")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-minutes", type=float, help="stop (checkpointed, artefact saved) after this much training"
    )
    parser.add_argument("--no-progress", action="store_true")
    add_device_args(parser)


def add_parser(sub) -> None:
    tr = sub.add_parser("train", help="train a method's artefact (MuDAF LoRA delta, MoICE routers)")
    tsub = tr.add_subparsers(dest="train_command", required=True)
    mu = tsub.add_parser("mudaf", help="contrastive tuning of retrieval heads (alpha=0: plain fine-tuning)")
    _add_training_args(mu, examples=4000, lr=2e-4, warmup=0.05, max_words=80)
    mu.add_argument("--alpha", type=float, default=0.7, help="weight of the contrastive loss (0 = plain SFT)")
    mu.add_argument("--tau", type=float, default=0.05)
    mu.add_argument("--rank", type=int, default=16)
    mu.add_argument("--lora-layers", default="all", choices=["all", "targets"])
    mu.add_argument("--num-heads", type=int, default=8, help="target heads")
    mu.add_argument("--head-selection", default="sample", choices=["sample", "top"])
    mu.add_argument("--heads-file", type=Path, help="scores from `midlens heads score` (default: computed first)")
    mu.add_argument("--heads-n", type=int, default=200, help="prompts for the head scores when computed here")
    mu.set_defaults(func=run_mudaf)

    mo = tsub.add_parser("moice", help="router-only training of MoICE (the model stays frozen)")
    _add_training_args(
        mo,
        examples=600,
        lr=2e-3,
        warmup=0.2,
        max_words=60,
        lr_help="routers are tiny and see few steps on a CPU budget",
        warmup_help="fraction of steps (the paper: 20%%)",
    )
    mo.add_argument("--experts", type=int, default=7, help="N: RoPE bases (the native one first)")
    mo.add_argument("--top-k", type=int, default=3, help="K < N experts per token and head")
    mo.add_argument("--per-head", action="store_true", help="one router per head instead of per layer")
    mo.add_argument("--balance", type=float, default=0.3, help="alpha of the load-balancing loss")
    mo.set_defaults(func=run_moice)


def _positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise MidlensError(f"--{name} {value}: must be positive.")


def run_mudaf(args: argparse.Namespace) -> int:
    from midlens.cli.options import check_device
    from midlens.generators import Generator, load_model
    from midlens.generators.retrieval_heads import select_heads
    from midlens.training.data import training_examples
    from midlens.training.heads import retrieval_head_scores, save_scores
    from midlens.training.mudaf import MudafConfig, train_mudaf

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
    result = train_mudaf(loaded, examples, config, head_scores=scores, **_budget(args, examples))
    _print_trained(result, "delta", args.out)
    return 0


def _budget(args: argparse.Namespace, examples: list) -> dict:
    """The loop, artefact folder, data record and time limit every trainer takes, from the shared options."""
    from midlens.training.data import data_record
    from midlens.training.loop import LoopConfig

    return {
        "loop": LoopConfig(len(examples), args.batch, args.lr, args.warmup, seed=args.seed),
        "out": str(args.out),
        "data": data_record(examples, args.seed, args.max_words),
        "progress": not args.no_progress,
        "max_seconds": None if args.max_minutes is None else 60 * args.max_minutes,
    }


def _print_trained(result: dict, what: str, out: Path) -> None:
    meta, t = result["meta"], result["meta"]["training"]
    print(
        f"trained {meta['parameters']:,} {what} parameters on {t['examples_seen']} examples in {t['seconds']:.0f} s; "
        f"loss {t['loss_first_10']:.3f} -> {t['loss_last_10']:.3f}; artefact {out}"
    )


def _model_rope(model: str) -> tuple[float, int]:
    """(RoPE base, head_dim) from the model's config alone: no weights are loaded."""
    from transformers import AutoConfig

    from midlens.generators.methods.moice import rope_base
    from midlens.generators.model_cache import resolve_model_dir

    cfg = AutoConfig.from_pretrained(resolve_model_dir(model))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return rope_base(cfg), head_dim


def run_moice(args: argparse.Namespace) -> int:
    from midlens.cli.options import check_device
    from midlens.generators import load_model
    from midlens.generators.methods.moice import complementary_bases
    from midlens.training.data import training_examples
    from midlens.training.moice import MoiceConfig, train_moice

    for name in ("examples", "batch", "lr", "experts", "top_k"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if not 1 <= args.top_k < args.experts:
        raise MidlensError(
            f"--top-k {args.top_k} with --experts {args.experts}: K must be below N, or the balance loss is a "
            "constant with no gradient."
        )
    if args.balance < 0:
        raise MidlensError(f"--balance {args.balance}: a weight, 0 or more.")
    check_device(args)
    base, head_dim = _model_rope(args.model)
    bases = complementary_bases(base, head_dim, args.experts)
    loaded = load_model(args.model, args.device, args.dtype)
    examples = training_examples(loaded.tokenizer, args.examples, seed=args.seed, max_words=args.max_words)
    config = MoiceConfig(tuple(bases), args.top_k, args.per_head, args.balance)
    print("expert bases: " + ", ".join(f"{b:g}" for b in bases))
    result = train_moice(loaded, examples, config, **_budget(args, examples))
    _print_trained(result, "router", args.out)
    return 0
