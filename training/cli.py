"""`midlens heads score`, `midlens train mudaf|moice`, `midlens moice bases`: thin shells over training/ and
the methods' own modules.

midlens heads score --model smollm2-135m --n 200 --out runs/heads
midlens train mudaf --model smollm2-135m --examples 4000 --out runs/mudaf-smollm2
midlens train mudaf --model smollm2-135m --alpha 0 --out runs/sft-smollm2          # plain fine-tuning
midlens moice bases --model smollm2-135m --png runs/moice-bases.png
midlens train moice --model smollm2-135m --examples 600 --out runs/moice-smollm2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.names import EVAL_MODEL


def add_heads_parser(sub) -> None:
    from midlens.rag.options import add_device_args

    heads = sub.add_parser("heads", help="retrieval-head scores (MuDAF) of a model")
    hsub = heads.add_subparsers(dest="heads_command", required=True)
    score = hsub.add_parser("score", help="F1/EM retrieval score of every head on HotpotQA train prompts")
    score.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    score.add_argument("--method", default="baseline", help="method spec to score (e.g. mudaf, to compare)")
    score.add_argument("--n", type=int, default=200, help="number of prompts (train split)")
    score.add_argument("--seed", type=int, default=1, help="prompt selection seed")
    score.add_argument("--eps", type=float, default=0.3, help="attention mass that makes a passage 'attended'")
    score.add_argument("--max-words", type=int, default=80)
    score.add_argument("--out", type=Path, default=Path("runs/heads"), help="folder for <name>.json and .png")
    score.add_argument("--name", help="file name stem (default: the model name)")
    add_device_args(score)
    score.set_defaults(func=cmd_heads_score)


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
    from midlens.rag.options import add_device_args, positive_int

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


def add_train_parser(sub) -> None:
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
    mu.set_defaults(func=cmd_train_mudaf)

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
    mo.set_defaults(func=cmd_train_moice)


def add_moice_parser(sub) -> None:
    from midlens.rag.options import add_device_args

    mo = sub.add_parser("moice", help="MoICE tooling: the expert RoPE bases derived for a model")
    msub = mo.add_subparsers(dest="moice_command", required=True)
    b = msub.add_parser("bases", help="print the expert bases (waveform criterion) and plot their waveforms")
    b.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    b.add_argument("--experts", type=int, default=7)
    b.add_argument("--max-distance", type=int, default=4096, help="distances the criterion covers (tokens)")
    b.add_argument("--png", type=Path, help="write the waveform plot here")
    b.set_defaults(func=cmd_moice_bases)
    u = msub.add_parser("usage", help="share of routes each expert gets, per layer, on evaluation-split prompts")
    u.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    u.add_argument("--method", default="moice", help="a moice spec, e.g. \"moice(artefact='runs/moice')\"")
    u.add_argument("--n", type=int, default=20, help="prompts (HotpotQA evaluation split, 10 paragraphs)")
    u.add_argument("--max-words", type=int, default=60)
    u.add_argument("--json", type=Path, help="write the per-layer usage here")
    u.add_argument("--png", type=Path, help="write a layers x experts heatmap here")
    add_device_args(u)
    u.set_defaults(func=cmd_moice_usage)


def _positive(name: str, value: int | float) -> None:
    if value <= 0:
        raise MidlensError(f"--{name} {value}: must be positive.")


def cmd_heads_score(args: argparse.Namespace) -> int:
    from midlens.generators import Generator, load_model
    from midlens.rag.options import check_device
    from midlens.training.data import training_examples
    from midlens.training.heads import heatmap, retrieval_head_scores, save_scores

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
    from midlens.generators import Generator, load_model
    from midlens.generators.retrieval_heads import select_heads
    from midlens.rag.options import check_device
    from midlens.training.data import data_record, training_examples
    from midlens.training.heads import retrieval_head_scores, save_scores
    from midlens.training.loop import LoopConfig
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
        max_seconds=_max_seconds(args),
    )
    _print_trained(result["meta"]["delta"]["parameters"], "delta", result["meta"]["training"], args.out)
    return 0


def _max_seconds(args: argparse.Namespace) -> float | None:
    return None if args.max_minutes is None else 60 * args.max_minutes


def _print_trained(parameters: int, what: str, training: dict, out: Path) -> None:
    t = training
    print(
        f"trained {parameters:,} {what} parameters on {t['examples_seen']} examples in {t['seconds']:.0f} s; "
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


def cmd_moice_bases(args: argparse.Namespace) -> int:
    from midlens.generators.methods.moice import complementary_bases, plot_waveforms

    _positive("experts", args.experts)
    _positive("max-distance", args.max_distance)
    base, head_dim = _model_rope(args.model)
    bases = complementary_bases(base, head_dim, args.experts, args.max_distance)
    print(f"{args.model}: head_dim {head_dim}, native base {base:g}")
    print("expert bases: " + ", ".join(f"{b:g}" for b in bases))
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot_waveforms(bases, head_dim, args.png, args.max_distance)
        print(f"waveforms in {args.png}")
    return 0


def cmd_train_moice(args: argparse.Namespace) -> int:
    from midlens.generators import load_model
    from midlens.generators.methods.moice import complementary_bases
    from midlens.rag.options import check_device
    from midlens.training.data import data_record, training_examples
    from midlens.training.loop import LoopConfig
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
    loop = LoopConfig(len(examples), args.batch, args.lr, args.warmup, seed=args.seed)
    print("expert bases: " + ", ".join(f"{b:g}" for b in bases))
    result = train_moice(
        loaded,
        examples,
        config,
        loop,
        str(args.out),
        data_record(examples, args.seed, args.max_words),
        progress=not args.no_progress,
        max_seconds=_max_seconds(args),
    )
    _print_trained(result["meta"]["parameters"], "router", result["meta"]["training"], args.out)
    return 0


def cmd_moice_usage(args: argparse.Namespace) -> int:
    import torch

    from midlens.generators import Generator, load_model, method_config
    from midlens.rag.options import check_device
    from midlens.training.data import training_examples
    from midlens.training.moice import usage_heatmap

    _positive("n", args.n)
    method_config(args.method)  # a bad spec fails before the model loads
    check_device(args)
    loaded = load_model(args.model, args.device, args.dtype)
    gen = Generator(loaded, method=args.method)
    if not all(s.num_experts > 1 for s in gen.parts.schemes):  # what the method does, not what it is called
        raise MidlensError(
            f"--method {args.method!r}: router usage needs a method that routes every layer over "
            "several RoPE experts, e.g. moice."
        )
    prompts = training_examples(loaded.tokenizer, args.n, seed=0, max_words=args.max_words, split="eval")
    per_layer = torch.zeros(len(gen.parts.schemes), gen.parts.schemes[0].num_experts)
    for ex in prompts:  # each prompt's prefill, every token and head, weighted equally per prompt
        gen.score(ex.prompt, calibrate=False)
        per_layer += torch.stack([s.last_usage.cpu() for s in gen.parts.schemes]) / len(prompts)
    bases = gen.parts.schemes[0].bases
    mean = per_layer.mean(0)
    print(f"{args.method} on {len(prompts)} evaluation-split prompts: share of (token, head) routes per expert")
    print("  ".join(f"{b:g}: {m:.3f}" for b, m in zip(bases, mean.tolist(), strict=True)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"method": args.method, "n": len(prompts), "bases": bases, "per_layer": per_layer.tolist()}
        args.json.write_text(json.dumps({**record, "mean": mean.tolist()}, indent=1) + "\n")
    if args.png:
        usage_heatmap(per_layer, bases, args.png)
        print(f"heatmap in {args.png}")
    return 0
