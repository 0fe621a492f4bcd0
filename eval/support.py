"""`midlens eval support`: answers as a user gets them, each with what its support score reads and whether it was right.

Each unit is one question with its gold passage at one slot (1 / 5 / 10 of 10), answered the way `Pipeline.answer`
answers by default (the model's answering method, or the method named, with the restack and citation rule measured
for it, the default instruction and answer length), its citations verified. A row keeps the method's spec and
`generators.answering.support.support_inputs` of the answer and its EM / F1, so support models are fitted
(training/support.py, on a train-split run) and measured (eval/support_report.py, on held-out runs) without the language
model. Resumable, one row per unit, as every eval run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from midlens.core.defaults import DEFAULT_MAX_NEW_TOKENS, EVAL_MODEL

DATASETS = ("hotpotqa", "squad", "kv")


@dataclass(frozen=True)
class SupportRunOptions:
    out: Path
    dataset: str = "hotpotqa"
    split: str = "eval"  # hotpotqa and squad: the train or eval split (kv is synthetic; its seed sets it apart)
    model: str = EVAL_MODEL
    method: str | None = None  # a method spec; None: the model's answering default (what `Pipeline.answer` runs)
    device: str = "auto"
    dtype: str = "auto"
    n: int = 70
    seed: int = 0
    k: int = 10
    positions: tuple[int, ...] = (1, 5, 10)
    max_words: int = 60
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    verify: bool = True
    shard: tuple[int, int] = (0, 1)
    limit: int | None = None
    progress: bool = True


def load_examples(options: SupportRunOptions):
    from midlens.eval.datasets import kv_retrieval, load_hotpotqa, load_squad

    if options.dataset == "hotpotqa":
        return load_hotpotqa(options.n, options.seed, k=options.k, max_words=options.max_words, split=options.split)
    if options.dataset == "squad":
        return load_squad(options.n, options.seed, k=options.k, max_words=options.max_words, split=options.split)
    if options.dataset == "kv":
        # A seed of its own per split, so a train run and an eval run never share a key.
        return kv_retrieval(options.n, pairs=options.k, seed=options.seed + (1000 if options.split == "train" else 0))
    raise ValueError(f"dataset {options.dataset!r}: use one of {', '.join(DATASETS)}.")


def read_run(folder: Path) -> tuple[dict, list[dict]]:
    """The config and rows of an `eval support` run (every shard's file, each row with its method's spec), refused
    with what to pass otherwise."""
    import json

    from midlens.core.errors import InvalidArgumentError
    from midlens.eval import runner

    folder = Path(folder)
    config_file = folder / runner.CONFIG
    if not config_file.is_file():
        raise InvalidArgumentError(f"{folder}: no {runner.CONFIG}; pass a folder `midlens eval support` wrote.")
    config = json.loads(config_file.read_text())
    if config.get("kind") != "support":
        raise InvalidArgumentError(f"{folder}: a {config.get('kind')!r} run, not an `eval support` run.")
    rows = [r for f in sorted(folder.glob("results*.jsonl*")) for r in runner.read_rows(f)]
    # Rows written before they recorded their method answered with the config's (one method per run).
    spec = method_spec(config["method"])
    return config, [r if "method" in r else {**r, "method": spec} for r in rows]


def method_spec(recorded: dict) -> str:
    """The spec of a method as a run's config records it (`MethodConfig.to_dict`)."""
    from midlens.generators.methods.registry import method_config

    return method_config(recorded["name"], {k: v for k, v in recorded.items() if k != "name"}).spec()


def plan(options: SupportRunOptions) -> tuple[dict, list[dict], list]:
    """The run's config and units, and the examples they index; no model is loaded."""
    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.eval.datasets import data_sha256
    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.model_cache import content_sha256
    from midlens.generators.models.packaged_models import canonical_name, default_method

    examples = load_examples(options)
    model = canonical_name(options.model)
    device = resolve_device(options.device)
    method = method_config(options.method or default_method(model))
    name = options.dataset if options.split == "eval" else f"{options.dataset}-{options.split}"
    config = {
        "kind": "support",
        "model": model,
        "model_sha256": content_sha256(model),
        "device": str(device),
        "dtype": dtype_name(resolve_dtype(options.dtype, device)),
        "method": method.to_dict(),
        "dataset": name,
        "data_sha256": data_sha256(examples),
        "examples": len(examples),
        "n": options.n,
        "seed": options.seed,
        "k": options.k,
        "positions": list(options.positions),
        "max_words": options.max_words,
        "max_new_tokens": options.max_new_tokens,
        "verify": options.verify,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    units = [
        {
            "key": f"{ex.id}|{p}",
            "order": i * len(options.positions) + q,
            "example": i,
            "example_id": ex.id,
            "kind": "support",
            "dataset": name,
            "position": p,
        }
        for i, ex in enumerate(examples)
        for q, p in enumerate(options.positions)
    ]
    config["units"] = len(units)
    return config, units, examples


def run(options: SupportRunOptions) -> list[dict]:
    from midlens.eval import runner
    from midlens.eval.datasets import data_sha256
    from midlens.eval.metrics import answer_f1, best_subspan_em
    from midlens.eval.sweep import layout
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.support import support_inputs
    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.loading import load_model
    from midlens.generators.models.packaged_models import default_method
    from midlens.rag.pipeline import Pipeline

    config, units, examples = plan(options)

    def prefix_sha256(count: int) -> str:
        return data_sha256(examples[:count])

    _, _, _, todo = runner.pending_units(options.out, config, units, options.shard, options.limit, prefix_sha256)
    if not todo:
        return runner.read_rows(Path(options.out) / runner.results_name(options.shard))
    method = method_config(options.method or default_method(config["model"]))
    loaded = load_model(options.model, options.device, options.dtype)
    pipe = Pipeline(None, Generator(loaded, method=method), max_new_tokens=options.max_new_tokens)

    def evaluate(unit: dict) -> dict:
        example = examples[unit["example"]]
        t0 = time.perf_counter()
        answer = pipe.answer(example.question, layout(example, options.k, unit["position"]), verify=options.verify)
        return {
            "prediction": answer.text,
            "em": best_subspan_em(answer.text, example.answers),
            "f1": answer_f1(answer.text, example.answers),
            "answers": example.answers,
            "generated_tokens": answer.generated_tokens,
            "prompt_tokens": answer.prompt_tokens,
            "restacked": answer.restack is not None,
            "method": method.spec(),  # what a support model fitted on these rows learns the answers of
            "inputs": support_inputs(answer),
            "timings": answer.timings,
            "seconds": time.perf_counter() - t0,
        }

    return runner.run_units(
        options.out,
        config,
        units,
        evaluate,
        options.shard,
        limit=options.limit,
        progress=options.progress,
        prefix_sha256=prefix_sha256,
    )
