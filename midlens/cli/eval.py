"""`midlens eval`: sweep, rerank, e2e, merge, report (the evaluation itself: midlens.eval).

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
from pathlib import Path

from midlens.cli.options import RETRIEVAL_HELP, add_device_args, add_evidence_args, positive_int
from midlens.core.defaults import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT_STYLE,
    DEFAULT_RETRIEVAL,
    DEFAULT_TOP_K,
    EVAL_MODEL,
    ORDERINGS,
    PROMPT_STYLES,
    RETRIEVALS,
    SLOT_POLICIES,
)

EXAMPLES = {
    "eval": """examples:
  midlens eval sweep --dataset hotpotqa --n 200 --k 10 --out runs/h
  midlens eval report runs/h --out runs/report
""",
    "sweep": """examples:
  midlens eval sweep --dataset hotpotqa --n 200 --k 10 --positions 1,5,10 --methods baseline,ms-poe --out runs/h
  midlens eval sweep --dataset kv --k 10 --n 100 --out runs/kv
  midlens eval sweep --dataset nq-open-10_total_documents_gold_at_0.jsonl.gz --k 10 --out runs/litm
  midlens eval sweep --dataset hotpotqa --n 40 --methods baseline --restack mudaf --restack-rounds 1,2 --out runs/r
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
    p.add_argument("--out", required=True, type=Path, help="run directory (created; resumed when it exists)")
    p.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    add_device_args(p)
    p.add_argument(
        "--methods",
        default=methods,
        help="comma-separated method specs, NAME or NAME(option=value, ...), e.g. "
        "'ms-poe(ratio_min=1.0, ratio_max=1.2)'; `midlens methods` lists them",
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
        default=None,
        choices=["eval", "train"],
        help="hotpotqa: the held-out evaluation split (the default), or questions of the train split, for choosing "
        "a method's options on a tuning slice that evaluation never sees; squad: the articles of one split "
        "(default: all articles, as SQuAD runs before the split)",
    )
    add_evidence_args(p)


def add_parser(sub) -> None:
    """`midlens eval`'s subcommands and their flags: a declaration, one line per flag, read top to bottom."""
    ev = sub.add_parser(
        "eval", help="offline MDQA evaluation: sweep, rerank, e2e, merge, report", epilog=EXAMPLES["eval"]
    )
    esub = ev.add_subparsers(dest="eval_command", required=True)

    sw = esub.add_parser("sweep", help="lost-in-the-middle position sweep", epilog=EXAMPLES["sweep"])
    sw.add_argument(
        "--dataset", default="hotpotqa", help="hotpotqa | squad (SQuAD v2 dev) | kv | a lost-in-the-middle .jsonl[.gz]"
    )
    sw.add_argument("--k", type=positive_int, default=10, help="documents per prompt (kv: key-value pairs)")
    sw.add_argument("--positions", type=int_list, default=(), help="1-based gold positions; default 1,K/2,K")
    sw.add_argument("--no-logprob", action="store_true", help="skip the gold-answer log-probability pass")
    sw.add_argument(
        "--stop-at-line-end",
        action="store_true",
        help="stop decoding once the answer has a complete non-empty line: the metrics read only that line, "
        "so scores are unchanged and long --max-new-tokens cost only what the answer needs",
    )
    _common(sw, "baseline,ms-poe")
    sw.add_argument(
        "--orderings",
        default="",
        help=f"passage orderings to run beside the methods, on the baseline generator: {', '.join(ORDERINGS)} "
        "(LongContextReorder; attention sorting), comma-separated",
    )
    _restack_args(sw)
    sw.set_defaults(func=run, mode="sweep")

    rr = esub.add_parser(
        "rerank", help="attention evidence as a reranker vs dense order and BM25", epilog=EXAMPLES["rerank"]
    )
    rr.add_argument("--dataset", default="hotpotqa", help="hotpotqa | a lost-in-the-middle .jsonl[.gz]")
    _common(rr, "baseline")
    rr.set_defaults(func=run, mode="rerank", max_new_tokens=0)

    e2e = esub.add_parser("e2e", help="end to end: questions + corpus -> retrieve -> generate", epilog=EXAMPLES["e2e"])
    e2e.add_argument("--questions", type=Path, help="questions .jsonl; default: the 40 embedded HotpotQA questions")
    e2e.add_argument("--corpus", type=Path, help="corpus folder or .jsonl; default: the embedded HotpotQA paragraphs")
    e2e.add_argument("--index-dir", type=Path, help="where to keep the dense index (reused when unchanged)")
    e2e.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help="passages retrieved per question")
    e2e.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVALS, help=RETRIEVAL_HELP)
    _common(e2e, "baseline,ms-poe")
    _restack_args(e2e)
    # Answers as long as `ask` gives, so e2e measures what a user gets (the sweeps keep short answers).
    e2e.set_defaults(func=run, mode="e2e", max_new_tokens=DEFAULT_MAX_NEW_TOKENS)

    mg = esub.add_parser("merge", help="join shard files / run directories of one run", epilog=EXAMPLES["merge"])
    mg.add_argument("sources", nargs="+", type=Path)
    mg.add_argument("--out", required=True, type=Path)
    mg.set_defaults(func=merge)

    rp = esub.add_parser("report", help="markdown tables and PNG plots from run directories", epilog=EXAMPLES["report"])
    rp.add_argument("runs", nargs="+", type=Path)
    rp.add_argument("--out", type=Path, help="output folder (default: the first run directory)")
    rp.add_argument(
        "--against",
        metavar="METHOD",
        help="method the paired tables subtract, as the tables label it, e.g. 'mudaf(alpha=0)' (default: baseline)",
    )
    rp.set_defaults(func=report)

    from midlens.cli.eval_cite import add_parsers as add_cite_parsers

    add_cite_parsers(esub)

    from midlens.cli.eval_support import add_parsers as add_support_parsers

    add_support_parsers(esub)


def _restack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--restack",
        metavar="SCORER",
        help="also run each method on passages restacked by this method's evidence (e.g. mudaf): the strongest "
        "placed in the slots the model reads best; rows labelled METHOD+restack(SCORER)",
    )
    p.add_argument(
        "--restack-rounds",
        type=int_list,
        default=(1,),
        help="scoring passes before each restacked answer; several (1,2) run one system each",
    )
    p.add_argument(
        "--restack-slots",
        choices=SLOT_POLICIES,
        default="measured",
        help="where the strongest passages go: the slot order measured for the packaged model; first (slot 1, "
        "2, ...), last (the last slot, then the one before) or read (the slots each prompt's content-free pass "
        "draws most to): no measurement needed, any model",
    )
    p.add_argument(
        "--restack-methods",
        default="",
        help="comma-separated methods (of --methods) that also answer restacked (default: every one)",
    )


def int_list(text: str) -> tuple[int, ...]:
    """argparse type for comma-separated integers (argparse names the option in its message)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def run_options(args: argparse.Namespace):
    """The parsed command line as the one RunOptions value an eval run is made of: every value converted here,
    the cheap checks before the method registry (torch) loads."""
    from dataclasses import replace

    from midlens.cli.options import evidence_config
    from midlens.core.batch_size import parse_batch_size
    from midlens.core.method_spec import split_top_level
    from midlens.eval.options import RunOptions
    from midlens.eval.runner import parse_shard

    mode = args.mode
    options = RunOptions(
        mode=mode,
        out=args.out,
        methods=tuple(split_top_level(args.methods)),
        orderings=tuple(split_top_level(getattr(args, "orderings", ""))),
        restack=getattr(args, "restack", None),
        restack_rounds=getattr(args, "restack_rounds", (1,)),
        restack_slots=getattr(args, "restack_slots", "measured"),
        restack_methods=tuple(split_top_level(getattr(args, "restack_methods", ""))),
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        n=args.n,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        prompt_style=args.prompt_style,
        dataset=getattr(args, "dataset", "hotpotqa"),
        split=args.split,
        max_words=args.max_words,
        k=getattr(args, "k", 10),
        positions=getattr(args, "positions", ()),
        logprob=not getattr(args, "no_logprob", False),
        stop_at_line_end=getattr(args, "stop_at_line_end", False),
        questions=getattr(args, "questions", None),
        corpus=getattr(args, "corpus", None),
        index_dir=getattr(args, "index_dir", None),
        top_k=getattr(args, "top_k", DEFAULT_TOP_K),
        retrieval=getattr(args, "retrieval", DEFAULT_RETRIEVAL),
        batch_size=parse_batch_size(args.batch_size),
        shard=parse_shard(args.shard),
        limit=args.limit,
        progress=not args.no_progress,
        engine=args.engine,
        address=args.address,
        workers=args.workers,
        gpus_per_worker=args.gpus_per_worker,
        threads_per_worker=args.threads_per_worker,
    )
    # The evidence settings load torch, so they join the options once the cheap checks have passed.
    return replace(options, evidence=evidence_config(args))


def run(args: argparse.Namespace) -> int:
    from midlens.eval import runner

    options = run_options(args)
    if options.engine == "ray":
        from midlens.eval.ray_engine import run_on_ray

        rows = run_on_ray(options)
    else:
        from midlens.eval.plan import build_run

        run = build_run(options)
        rows = runner.run_units(
            options.out,
            run.plan.config,
            run.plan.units,
            run.evaluate,
            options.shard,
            options.limit,
            progress=options.progress,
            evaluate_many=run.evaluate_many,
            batch_size=run.plan.group_size,
            prefix_sha256=run.plan.prefix_sha256,
        )
    print(f"{len(rows)} results in {options.out / runner.results_name(options.shard)}")
    return 0


def merge(args: argparse.Namespace) -> int:
    from midlens.eval.runner import merge as merge_runs

    written, missing = merge_runs(args.sources, args.out)
    print(
        f"{written} results merged into {args.out / 'results.jsonl'}"
        + (f"; {missing} units not run yet" if missing else "")
    )
    return 0


def report(args: argparse.Namespace) -> int:
    from midlens.eval.report import write_report

    path = write_report(args.runs, args.out or args.runs[0], args.against)
    print(f"report written to {path}")
    return 0
