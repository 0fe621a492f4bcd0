"""`midlens train METHOD`: train a method's artefact. Which methods train, and with which options, is their
registry entries' business (`Method.trainer` -> a `training.recipe.Recipe`); this module only turns a recipe's
options into flags.

midlens train mudaf --model smollm2-135m --examples 4000 --out runs/mudaf-smollm2
midlens train mudaf --model smollm2-135m --alpha 0 --out runs/sft-smollm2          # plain fine-tuning
midlens train moice --model smollm2-135m --examples 600 --out runs/moice-smollm2
midlens train mudaf --help                                                          # a method's own options
"""

from __future__ import annotations

import argparse
from pathlib import Path

from midlens.cli.options import Parser, add_device_args, check_device, positive_int
from midlens.core.defaults import EVAL_MODEL
from midlens.core.errors import MidlensError

EXAMPLES = """examples:
  midlens train mudaf --out runs/mudaf-smollm2
  midlens train mudaf --alpha 0 --out runs/sft-smollm2
  midlens train moice --examples 600 --out runs/moice-smollm2
  midlens train METHOD --help     (the method's own options)
"""


def add_parser(sub) -> None:
    # The methods that train and their options come from the registry, which loads torch: they are read when the
    # command runs, so building the parser (and `midlens --help`) stays fast.
    what = "train a method's artefact (a MuDAF delta, MoICE routers, a searched channel)"
    tr = sub.add_parser("train", help=what, epilog=EXAMPLES)
    tr.add_argument("method", help="a method that trains; `midlens train METHOD --help` lists its options")
    tr.add_argument("options", nargs=argparse.REMAINDER, help="the method's options (see above)")
    tr.set_defaults(func=run)


# Budget field -> (type, help) of its flag; a recipe offers those it reads (Recipe.budget_flags).
BUDGET_ARGUMENTS = {
    "examples": (positive_int, "training examples (train split)"),
    "batch": (positive_int, "examples per optimizer step"),
    "lr": (float, "peak learning rate"),
    "warmup": (float, "fraction of steps"),
    "max_words": (int, "clip paragraphs to ~N words"),
    "seed": (int, None),
    "data": (
        str,
        "what the examples come from: hotpotqa (its train split; every shipped artefact), or "
        "hotpotqa+squad (alternated with SQuAD's train articles)",
    ),
    "max_minutes": (
        float,
        "wall-clock budget from the model load on, preparation included (mudaf's retrieval-head scoring): "
        "training stops after the step that crosses it (at least one step; checkpointed, artefact saved)",
    ),
}


def recipe_parser(method: str, recipe) -> Parser:
    """The flags of one recipe: the options every training shares, with the recipe's defaults, then its own."""
    from midlens.training.recipe import BUDGET_FLAGS, Budget

    # Budget's own defaults where a recipe sets none (a search sets no learning rate).
    defaults = {**{f: Budget.__dataclass_fields__[f].default for f in BUDGET_FLAGS}, **recipe.budget}
    p = Parser(prog=f"midlens train {method}", description=recipe.summary)
    p.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    p.add_argument("--out", type=Path, required=True, help="artefact folder to write (checkpoints beside it)")
    flags = set(recipe.budget_flags)
    for name, (kind, text) in BUDGET_ARGUMENTS.items():
        if name in flags:
            help_text = recipe.budget_help.get(name, text)
            p.add_argument("--" + name.replace("_", "-"), type=kind, default=defaults[name], help=help_text)
    p.set_defaults(**{f: defaults.get(f) for f in BUDGET_FLAGS if f not in flags})
    p.add_argument("--no-progress", action="store_true")
    add_device_args(p)
    for option in recipe.options:
        flag = "--" + option.name.replace("_", "-")
        if isinstance(option.default, bool):
            p.add_argument(flag, action="store_true", help=option.help)
        else:
            kind = option.type or type(option.default)
            p.add_argument(flag, type=kind, default=option.default, choices=option.choices, help=option.help)
    return p


def run(args: argparse.Namespace) -> int:
    import importlib

    from midlens.generators import load_model
    from midlens.generators.methods.registry import REGISTRY
    from midlens.training.recipe import Budget

    trainable = [m.name for m in REGISTRY.values() if m.trainer]
    entry = REGISTRY.get(args.method)
    if entry is None or entry.trainer is None:
        raise MidlensError(f"{args.method!r} has nothing to train: choose one of {', '.join(trainable)}.")
    recipe = importlib.import_module(entry.trainer).RECIPE
    ns = recipe_parser(entry.name, recipe).parse_args(args.options)
    options = {o.name: getattr(ns, o.name) for o in recipe.options}
    budget = Budget(
        ns.examples, ns.batch, ns.lr, ns.warmup, ns.max_words, ns.seed, ns.max_minutes, not ns.no_progress, ns.data
    )
    budget.check()
    if recipe.check is not None:
        recipe.check(options)  # before the model loads
    check_device(ns)
    loaded = load_model(ns.model, ns.device, ns.dtype)
    result = recipe.train(loaded, options, budget, str(ns.out))
    if "summary" in result:  # a recipe that learns no parameters (a search) says what it chose
        print(result["summary"])
        return 0
    meta, t = result["meta"], result["meta"]["training"]
    print(
        f"trained {meta['parameters']:,} {recipe.trained} parameters on {t['examples_seen']} examples in "
        f"{t['seconds']:.0f} s; loss {t['loss_first_10']:.3f} -> {t['loss_last_10']:.3f}; artefact {ns.out}"
    )
    return 0
