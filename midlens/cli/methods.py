"""`midlens methods`: the registered methods, their options and defaults (from the registry, never a list here);
`midlens methods SPEC`: one method on a model, with what its registry entry shows of itself (e.g. the RoPE bases
MoICE's routers mix and how often each is chosen)."""

from __future__ import annotations

import argparse
from pathlib import Path

from midlens.cli.options import METHOD_HELP, add_device_args, check_device, chosen_model, cli_step
from midlens.core.defaults import METHOD_SHORTHANDS

EXAMPLES = """examples:
  midlens methods
  midlens methods --model PATH          # what the model's layers do, and which methods run on it
  midlens methods moice --n 20 --out runs/moice-inspect
  midlens ask "Who directed Wings of Desire?" --method "ms-poe(ratio_min=1.0, ratio_max=1.3)"
  midlens ask "Who directed Wings of Desire?" --method finetuned
"""


def add_parser(sub) -> None:
    methods = sub.add_parser(
        "methods", help="list the registered methods and their options, or inspect one", epilog=EXAMPLES
    )
    methods.add_argument("spec", nargs="?", help=f"inspect this method on --model; {METHOD_HELP}")
    methods.add_argument(
        "--model", help="model to inspect it on (default: the default model, or the one its artefact ships for)"
    )
    methods.add_argument("--n", type=int, default=20, help="prompts (HotpotQA evaluation split) a method measures on")
    methods.add_argument("--max-words", type=int, default=60, help="clip those prompts' paragraphs to ~N words")
    methods.add_argument("--out", type=Path, help="folder for the figures and data the method writes")
    add_device_args(methods)
    methods.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from midlens.generators.methods.registry import REGISTRY

    if getattr(args, "spec", None):
        return _inspect(args)
    if getattr(args, "model", None):
        return _support(args)
    width = max(len(name) for name in REGISTRY) + 2  # every summary starts in one column, the longest name's too
    for method in REGISTRY.values():
        options = ", ".join(f"{k}={v!r}" for k, v in method.defaults.items()) or "no options"
        print(f"{method.name:<{width}}{method.summary}\n{'':<{width}}{options}")
    for shorthand, spec in METHOD_SHORTHANDS.items():
        print(f"{shorthand:<{width}}shorthand for {spec}")
    return 0


def _support(args: argparse.Namespace) -> int:
    """What the model's layers do, as the attention module reads them, and which methods run on it."""
    check_device(args)
    from midlens.generators import load_model
    from midlens.generators.attention.anatomy import index_ranges, model_anatomy
    from midlens.generators.methods.registry import REGISTRY, support_on

    loaded = load_model(args.model, args.device, args.dtype)
    layers = model_anatomy(loaded.model)
    arch = (loaded.model.config.architectures or [type(loaded.model).__name__])[0]
    print(f"{loaded.name}: {arch}, {len(layers)} layers")
    kinds: dict[str, list[int]] = {}
    for i, layer in enumerate(layers):
        kinds.setdefault(layer.describe(), []).append(i)
    for what, indices in kinds.items():
        print(f"  {'layers' if len(indices) > 1 else 'layer'} {index_ranges(indices)}: {what}")
    support = support_on(loaded, cli_step)
    width = max(len(name) for name in support) + 2
    for name, reason in support.items():
        scope = REGISTRY[name].scope
        where = scope(loaded.model) if scope is not None and reason is None else None
        status = ("runs" + (f" ({where})" if where else "")) if reason is None else "no: " + reason
        print(f"{name:<{width}}{status}")
    # A shorthand runs a method with other options (finetuned = mudaf(alpha=0)), whose artefact may ship where the
    # method's default one does not (Gemma 3 270M ships the fine-tune only).
    from midlens.core.defaults import METHOD_SHORTHANDS
    from midlens.generators.methods.registry import available

    for short in (s for s in METHOD_SHORTHANDS if s in available(loaded.name)):
        print(f"{short:<{width}}runs ({METHOD_SHORTHANDS[short]}, its shipped artefact)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from midlens.cli.options import method_spec
    from midlens.core.errors import InvalidArgumentError
    from midlens.generators.methods.registry import REGISTRY

    if args.n < 0:
        raise InvalidArgumentError(f"--n {args.n}: the number of prompts, 0 or more.")
    args.method = args.spec
    config = method_spec(args)
    entry = REGISTRY[config.name]
    print(f"{entry.name}: {entry.summary}\noptions: {config.to_dict()}")
    if entry.inspect is None:
        print(f"{entry.name} shows nothing beyond its options.")
        return 0
    args.model = chosen_model(args, config)
    check_device(args)
    from midlens.generators import Generator, load_model
    from midlens.training.data import training_examples

    loaded = load_model(args.model, args.device, args.dtype)
    examples = training_examples(loaded.tokenizer, args.n, 0, args.max_words, split="eval") if args.n else []
    lines = entry.inspect(Generator(loaded, method=config), [ex.prompt for ex in examples], args.out)
    print("\n".join(lines))
    return 0
