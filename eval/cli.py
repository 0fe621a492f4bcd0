"""`midlens eval`: sweep, rerank, e2e, merge, report. Every answer goes through Generator/Pipeline.

midlens eval sweep  --dataset hotpotqa --n 200 --k 10 --positions 1,5,10 --methods baseline,ms-poe --out runs/h
midlens eval sweep  --dataset kv --k 10 --n 100 --out runs/kv
midlens eval sweep  --dataset path/to/nq-open-10_total_documents_gold_at_0.jsonl.gz --k 10 --out runs/litm
midlens eval rerank --dataset hotpotqa --n 200 --out runs/rerank
midlens eval e2e    --questions q.jsonl --corpus docs/ --top-k 5 --out runs/e2e
midlens eval merge  runs/h runs/h-shard1 ... --out runs/h-all
midlens eval report runs/h runs/kv runs/rerank --out runs/report
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.names import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT_STYLE,
    DEFAULT_RETRIEVAL,
    DEFAULT_TOP_K,
    EVAL_MODEL,
    ORDERINGS,
    PROMPT_STYLES,
    RETRIEVALS,
)

SWEEP_MODES = ("sweep", "rerank", "e2e")


EXAMPLES = {
    "eval": """examples:
  midlens eval sweep --dataset hotpotqa --n 200 --k 10 --out runs/h
  midlens eval report runs/h --out runs/report
""",
    "sweep": """examples:
  midlens eval sweep --dataset hotpotqa --n 200 --k 10 --positions 1,5,10 --methods baseline,ms-poe --out runs/h
  midlens eval sweep --dataset kv --k 10 --n 100 --out runs/kv
  midlens eval sweep --dataset nq-open-10_total_documents_gold_at_0.jsonl.gz --k 10 --out runs/litm
""",
    "rerank": """examples:
  midlens eval rerank --dataset hotpotqa --n 200 --out runs/rerank
""",
    "e2e": """examples:
  midlens eval e2e --out runs/e2e
  midlens eval e2e --questions q.jsonl --corpus docs/ --top-k 5 --methods baseline,ms-poe --out runs/e2e
""",
    "merge": """examples:
  midlens eval merge runs/h runs/h-shard1 --out runs/h-all
""",
    "report": """examples:
  midlens eval report runs/h runs/kv runs/rerank --out runs/report
  midlens eval report runs/sft runs/mudaf --against "mudaf(alpha=0)" --out runs/mudaf-vs-sft
""",
}


def _common(p: argparse.ArgumentParser, methods: str) -> None:
    from midlens.rag.options import add_device_args, add_evidence_args, positive_int

    p.add_argument("--out", required=True, type=Path, help="run directory (created; resumed when it exists)")
    p.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    add_device_args(p)
    p.add_argument(
        "--methods",
        default=methods,
        help="comma-separated method specs, NAME or NAME(option=value, ...), e.g. "
        "'ms-poe(ratio_min=1.0, ratio_max=1.2)'; also the orderings lcr and attn-sort (on the baseline generator)",
    )
    p.add_argument("--n", type=positive_int, help="number of questions (seeded subsample; default: all)")
    p.add_argument("--seed", type=int, default=0, help="subsampling / synthetic-data seed")
    p.add_argument("--max-new-tokens", type=int, default=24, help="longest answer, in tokens")
    p.add_argument("--shard", help="i/n: run only every n-th example starting at i (0-based)")
    p.add_argument("--limit", type=int, help="stop after this many new units")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--batch-size",
        default="1",
        help="prompts answered at once: N, or auto (the largest batch that fits on a GPU, halving on "
        "out-of-memory; 1 on the CPU, where batches are not faster). Rows equal batch 1's",
    )
    p.add_argument(
        "--engine",
        default="local",
        choices=["local", "ray"],
        help="local: this process (default); ray: workers on a Ray cluster, through Ray Data",
    )
    p.add_argument("--address", help="ray: the cluster to join (default: start a local one)")
    p.add_argument("--workers", type=positive_int, default=2, help="ray: evaluator actors, each with its own model")
    p.add_argument("--gpus-per-worker", type=float, default=0.0, help="ray: GPUs each actor reserves (e.g. 0.5)")
    p.add_argument("--threads-per-worker", type=positive_int, default=1, help="ray: CPU threads each actor uses")
    p.add_argument("--max-words", type=int, default=100, help="hotpotqa: clip paragraphs to ~N words (0: whole)")
    p.add_argument(
        "--prompt-style",
        default=DEFAULT_PROMPT_STYLE,
        choices=PROMPT_STYLES,
        help="instruction above the passages: litm (Liu et al.'s) or short (asks for the bare answer)",
    )
    p.add_argument(
        "--split",
        default="eval",
        choices=["eval", "train"],
        help="hotpotqa: the held-out evaluation split, or questions of the train split, for choosing a "
        "method's options on a tuning slice that evaluation never sees",
    )
    add_evidence_args(p)


def add_eval_parser(sub) -> None:
    from midlens.rag.options import RETRIEVAL_HELP, positive_int

    ev = sub.add_parser(
        "eval", help="offline MDQA evaluation: sweep, rerank, e2e, merge, report", epilog=EXAMPLES["eval"]
    )
    esub = ev.add_subparsers(dest="eval_command", required=True)

    sw = esub.add_parser("sweep", help="lost-in-the-middle position sweep", epilog=EXAMPLES["sweep"])
    sw.add_argument(
        "--dataset", default="hotpotqa", help="hotpotqa | squad (SQuAD v2 dev) | kv | a lost-in-the-middle .jsonl[.gz]"
    )
    sw.add_argument("--k", type=positive_int, default=10, help="documents per prompt (kv: key-value pairs)")
    sw.add_argument("--positions", default=None, help="1-based gold positions; default 1,K/2,K")
    sw.add_argument("--no-logprob", action="store_true", help="skip the gold-answer log-probability pass")
    sw.add_argument(
        "--stop-at-line-end",
        action="store_true",
        help="stop decoding once the answer has a complete non-empty line: the metrics read only that line, "
        "so scores are unchanged and long --max-new-tokens cost only what the answer needs",
    )
    _common(sw, "baseline,ms-poe,lcr,attn-sort")
    sw.set_defaults(func=cmd_run, mode="sweep")

    rr = esub.add_parser(
        "rerank", help="attention evidence as a reranker vs dense order and BM25", epilog=EXAMPLES["rerank"]
    )
    rr.add_argument("--dataset", default="hotpotqa", help="hotpotqa | a lost-in-the-middle .jsonl[.gz]")
    _common(rr, "baseline")
    rr.set_defaults(func=cmd_run, mode="rerank", max_new_tokens=0)

    e2e = esub.add_parser("e2e", help="end to end: questions + corpus -> retrieve -> generate", epilog=EXAMPLES["e2e"])
    e2e.add_argument("--questions", help="questions .jsonl; default: the 40 embedded HotpotQA questions")
    e2e.add_argument("--corpus", help="corpus folder or .jsonl; default: the embedded HotpotQA paragraphs")
    e2e.add_argument("--index-dir", type=Path, help="where to keep the dense index (reused when unchanged)")
    e2e.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help="passages retrieved per question")
    e2e.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVALS, help=RETRIEVAL_HELP)
    _common(e2e, "baseline,ms-poe")
    # Answers as long as `ask` gives, so e2e measures what a user gets (the sweeps keep short answers).
    e2e.set_defaults(func=cmd_run, mode="e2e", max_new_tokens=DEFAULT_MAX_NEW_TOKENS)

    mg = esub.add_parser("merge", help="join shard files / run directories of one run", epilog=EXAMPLES["merge"])
    mg.add_argument("sources", nargs="+", type=Path)
    mg.add_argument("--out", required=True, type=Path)
    mg.set_defaults(func=cmd_merge)

    rp = esub.add_parser("report", help="markdown tables and PNG plots from run directories", epilog=EXAMPLES["report"])
    rp.add_argument("runs", nargs="+", type=Path)
    rp.add_argument("--out", type=Path, help="output folder (default: the first run directory)")
    rp.add_argument(
        "--against",
        metavar="METHOD",
        help="method the paired tables subtract, as the tables label it, e.g. 'mudaf(alpha=0)' (default: baseline)",
    )
    rp.set_defaults(func=cmd_report)


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


def _method_specs(methods: list[str]) -> dict:
    """Method specs -> validated configs, before any model loads; an ordering runs on the baseline generator."""
    from midlens.core.method_spec import check_method_names, parse_method_spec

    if not methods:
        raise MidlensError("--methods is empty: name at least one method, e.g. --methods baseline.")
    check_method_names(methods, also=ORDERINGS)  # before torch loads: a misspelt name fails at once
    from midlens.generators.methods.registry import method_config

    configs = {}
    for spec in methods:
        name, options = parse_method_spec(spec)
        if name in ORDERINGS:
            if options:
                raise MidlensError(f"{name} reorders passages for the baseline generator and takes no options.")
            configs[spec] = method_config("baseline")
        else:
            configs[spec] = method_config(spec)
    return configs


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

    specs = _method_specs(split_top_level(args.methods))
    from midlens.eval import runner
    from midlens.eval.datasets import data_sha256
    from midlens.generators.generator import Generator
    from midlens.generators.loading import load_model
    from midlens.rag.options import check_device, evidence_config

    evidence = evidence_config(args)
    check_device(args)
    loaded = load_model(args.model, args.device, args.dtype)
    # A bad option that needs the model's shape (e.g. a layer index) fails here, before any unit runs.
    gens = {spec: Generator(loaded, method=config, evidence=evidence) for spec, config in specs.items()}
    config = {
        "kind": args.mode,
        "model": loaded.name,
        "model_sha256": loaded.sha256,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "methods": {m: {**g.method.to_dict(), "ordering": m if m in ORDERINGS else None} for m, g in gens.items()},
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
            units, evaluate, evaluate_many = _sweep(args, name, examples, gens, config)
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


def cmd_run(args: argparse.Namespace) -> int:
    from midlens.core.batch_size import parse_batch_size, units_per_group
    from midlens.eval import runner

    shard = runner.parse_shard(args.shard)
    batch_size = parse_batch_size(getattr(args, "batch_size", "1"))  # refused before the model loads
    if args.engine == "ray":
        from midlens.eval.ray_engine import run_on_ray

        rows = run_on_ray(args, shard)
    else:
        run = build_run(args)
        # The batch size is not part of the config: rows are the same at any size, so a run may resume with another.
        group = units_per_group(batch_size, run.device)
        rows = runner.run_units(
            args.out,
            run.config,
            run.units,
            run.evaluate,
            shard,
            args.limit,
            progress=not args.no_progress,
            evaluate_many=run.evaluate_many,
            batch_size=group,
        )
    print(f"{len(rows)} results in {args.out / runner.results_name(shard)}")
    return 0


def _sweep(args, name, examples, gens, config):
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


def cmd_merge(args: argparse.Namespace) -> int:
    from midlens.eval.runner import merge

    written, missing = merge(args.sources, args.out)
    print(
        f"{written} results merged into {args.out / 'results.jsonl'}"
        + (f"; {missing} units not run yet" if missing else "")
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from midlens.eval.report import write_report

    path = write_report(args.runs, args.out or args.runs[0], args.against)
    print(f"report written to {path}")
    return 0
