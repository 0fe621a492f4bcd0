"""What an evaluation run is: from its options, the loaded model, one generator per system, the units (example x
system x gold position) and the functions that evaluate them. Every answer goes through Generator/Pipeline.

The in-process engine (`eval.runner`) builds a run once; the Ray engine (`eval.ray_engine`) builds one per worker
from the same options, so a worker evaluates exactly what an in-process run would.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.names import (
    ORDERINGS,
)


def _examples(args: argparse.Namespace):
    from midlens.eval.datasets import kv_retrieval, load_hotpotqa, load_litm, load_squad

    if args.dataset == "hotpotqa":
        mode = "mdqa" if args.mode == "sweep" else "rerank"
        max_words = None if args.max_words <= 0 else args.max_words
        # Another split is another dataset name, so a report never pools tuning rows with evaluation rows.
        name = "hotpotqa" if args.split == "eval" else f"hotpotqa-{args.split}"
        k = getattr(args, "k", 10)
        return name, load_hotpotqa(args.n, args.seed, mode=mode, k=k, max_words=max_words, split=args.split)
    if args.dataset == "squad":
        if args.mode != "sweep":
            raise MidlensError("squad has one relevant paragraph per question: use it with `eval sweep`.")
        max_words = None if args.max_words <= 0 else args.max_words
        return "squad-v2-dev", load_squad(args.n, args.seed, k=args.k, max_words=max_words)
    if args.dataset == "kv":
        if args.mode != "sweep":
            raise MidlensError("kv retrieval has one relevant pair and no retriever order: use it with `eval sweep`.")
        return f"kv{args.k}", kv_retrieval(args.n or 100, pairs=args.k, seed=args.seed)
    return Path(args.dataset).name, load_litm(args.dataset, args.n, args.seed)


def _systems(methods: list[str], orderings: list[str]) -> tuple[dict, dict[str, str]]:
    """Method specs and ordering names -> (validated method config per row label, ordering per label), before any
    model loads. An ordering runs on the baseline generator and keeps its own name as its rows' label."""
    from midlens.core.method_spec import check_method_names

    if not methods and not orderings:
        raise MidlensError("--methods is empty: name at least one method, e.g. --methods baseline.")
    misplaced = [spec for spec in methods if spec.strip() in ORDERINGS]
    if misplaced:
        raise MidlensError(f"{', '.join(misplaced)}: an ordering, not a method; pass it with --orderings.")
    unknown = [name for name in orderings if name not in ORDERINGS]
    if unknown:
        raise MidlensError(f"--orderings {', '.join(unknown)}: choose from {', '.join(ORDERINGS)}.")
    check_method_names(methods)  # before torch loads: a misspelt name fails at once
    from midlens.generators.methods.registry import method_config

    configs = {spec: method_config(spec) for spec in methods}
    configs.update({name: method_config("baseline") for name in orderings})
    return configs, {name: name for name in orderings}


@dataclass
class Run:
    """What an eval run is: its config, its units, and how to evaluate one unit or a group of them."""

    config: dict
    units: list[dict]
    evaluate: Callable[[dict], dict]
    evaluate_many: Callable[[list[dict]], list[dict]] | None
    device: str


def build_run(args: argparse.Namespace) -> Run:
    """Load the model and data an eval command names and lay out its units. The in-process engine calls it once;
    the Ray engine calls it once per worker, so a worker evaluates exactly what an in-process run would."""
    if getattr(args, "split", "eval") != "eval" and getattr(args, "dataset", None) != "hotpotqa":
        raise MidlensError(f"--split {args.split}: only --dataset hotpotqa has splits.")
    from dataclasses import asdict

    from midlens.core.method_spec import split_top_level

    orderings_text = getattr(args, "orderings", "") or ""
    specs, orderings = _systems(split_top_level(args.methods), split_top_level(orderings_text))
    from midlens.eval import runner
    from midlens.eval.datasets import data_sha256
    from midlens.generators.evidence import EvidenceConfig
    from midlens.generators.generator import Generator
    from midlens.generators.loading import load_model

    evidence = EvidenceConfig.from_text(args.evidence_layers, args.evidence_query, args.evidence_heads)
    loaded = load_model(args.model, args.device, args.dtype)
    # A bad option that needs the model's shape (e.g. a layer index) fails here, before any unit runs.
    gens = {spec: Generator(loaded, method=config, evidence=evidence) for spec, config in specs.items()}
    config = {
        "kind": args.mode,
        "model": loaded.name,
        "model_sha256": loaded.sha256,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "methods": {m: {**g.method.to_dict(), "ordering": orderings.get(m)} for m, g in gens.items()},
        "evidence": asdict(evidence),
        "seed": args.seed,
        "n": args.n,
        "max_new_tokens": args.max_new_tokens,
        "prompt_style": args.prompt_style,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    config["methods_sha256"] = {m: runner.sha256_json(c) for m, c in config["methods"].items()}
    evaluate_many = None  # batched evaluation: the sweep so far
    if args.mode == "e2e":
        units, evaluate, evaluate_many = _e2e(args, loaded, gens, config)
    else:
        name, examples = _examples(args)
        config.update(
            max_words=getattr(args, "max_words", None),
            dataset=name,
            data_sha256=data_sha256(examples),
            examples=len(examples),
        )
        if args.mode == "sweep":
            units, evaluate, evaluate_many = _sweep(args, name, examples, gens, orderings, config)
        else:
            from midlens.core.batch_size import parse_batch_size
            from midlens.eval.rerank import evaluate_rerank, evaluate_rerank_many

            units = [
                {
                    "key": f"{ex.id}|{m}",
                    "order": i * len(gens) + j,
                    "example": i,
                    "example_id": ex.id,
                    "kind": "rerank",
                    "dataset": name,
                    "method": m,
                }
                for i, ex in enumerate(examples)
                for j, m in enumerate(gens)
            ]

            def evaluate(u):
                return evaluate_rerank(gens[u["method"]], examples[u["example"]], style=config["prompt_style"])

            batch_size = parse_batch_size(args.batch_size)

            def evaluate_many(group):
                def rerank(method, units):
                    chosen = [examples[u["example"]] for u in units]
                    return evaluate_rerank_many(gens[method], chosen, batch_size, style=config["prompt_style"])

                return runner.per_method(group, rerank)

    config["units"] = len(units)
    return Run(config, units, evaluate, evaluate_many, loaded.device.type)


def _sweep(args, name, examples, gens, orderings, config):
    from midlens.core.batch_size import parse_batch_size
    from midlens.eval import runner
    from midlens.eval.sweep import PositionSweep

    k = args.k
    if args.positions:
        try:
            positions = [int(x) for x in args.positions.split(",")]
        except ValueError:
            raise MidlensError(f"--positions {args.positions!r}: expected comma-separated integers.") from None
    else:
        positions = sorted({1, max(1, k // 2), k})
    bad = [p for p in positions if not 1 <= p <= k]
    if bad:
        raise MidlensError(f"--positions {bad} outside 1..{k} (K = --k).")
    config.update(k=k, positions=positions, logprob=not args.no_logprob)
    if args.stop_at_line_end:  # recorded only when set, so runs started before the option still resume
        config["stop_at_line_end"] = True
    per = len(gens) * len(positions)
    units = [
        {
            "key": f"{ex.id}|{m}|{p}",
            "order": i * per + j * len(positions) + q,
            "example": i,
            "example_id": ex.id,
            "kind": "sweep",
            "dataset": name,
            "k": k,
            "method": m,
            "position": p,
        }
        for i, ex in enumerate(examples)
        for j, m in enumerate(gens)
        for q, p in enumerate(positions)
    ]

    sweep = PositionSweep(
        gens,
        k,
        args.max_new_tokens,
        logprob=not args.no_logprob,
        style=config["prompt_style"],
        stop_at_line_end=args.stop_at_line_end,
        orderings=orderings,
    )

    def evaluate(u):
        return sweep(examples[u["example"]], u["position"], u["method"])

    batch_size = parse_batch_size(args.batch_size)

    def evaluate_many(group):
        return runner.per_method(
            group, lambda m, us: sweep.many(m, [(examples[u["example"]], u["position"]) for u in us], batch_size)
        )

    return units, evaluate, evaluate_many


def _e2e(args, loaded, gens, config):
    from midlens.core.batch_size import parse_batch_size
    from midlens.core.files import sha256_json
    from midlens.eval import runner
    from midlens.eval.datasets import load_questions
    from midlens.eval.e2e import evaluate_e2e, evaluate_e2e_many
    from midlens.rag.pipeline import Pipeline
    from midlens.retrievers.build import build_retriever
    from midlens.retrievers.corpus import default_corpus_path, default_questions_path

    questions = load_questions(args.questions or default_questions_path(), args.n, args.seed)
    retriever = build_retriever(args.corpus or default_corpus_path(), args.retrieval, index_dir=args.index_dir)
    pipes = {
        m: Pipeline(
            retriever, g, top_k=args.top_k, max_new_tokens=args.max_new_tokens, prompt_style=config["prompt_style"]
        )
        for m, g in gens.items()
    }
    config.update(
        dataset=Path(args.questions or default_questions_path()).name,
        top_k=args.top_k,
        retrieval=args.retrieval,
        data_sha256=sha256_json(questions),
        corpus_fingerprint=retriever.meta.get("fingerprint"),
        examples=len(questions),
    )
    units = [
        {
            "key": f"{q['id']}|{m}",
            "order": i * len(gens) + j,
            "example": i,
            "example_id": q["id"],
            "kind": "e2e",
            "dataset": config["dataset"],
            "method": m,
        }
        for i, q in enumerate(questions)
        for j, m in enumerate(gens)
    ]

    def evaluate(u):
        return evaluate_e2e(pipes[u["method"]], questions[u["example"]])

    batch_size = parse_batch_size(args.batch_size)

    def evaluate_many(group):
        return runner.per_method(
            group, lambda m, us: evaluate_e2e_many(pipes[m], [questions[u["example"]] for u in us], batch_size)
        )

    return units, evaluate, evaluate_many
