"""`midlens` command line: ask, bench, eval, demo. Thin shells around rag.pipeline."""

from __future__ import annotations

import argparse
import json
import sys

from rag.errors import MidlensError

BAR_WIDTH = 24


def add_method_args(parser: argparse.ArgumentParser) -> None:
    """Model/method options shared by every subcommand that runs a generator."""
    from generators.methods import METHODS
    from rag.models import DEFAULT_MODEL

    parser.add_argument("--model", default=DEFAULT_MODEL, help="registry name or local HF folder")
    parser.add_argument("--method", default="baseline", choices=METHODS)
    parser.add_argument("--ratio-min", type=float, help="ms-poe: smallest position ratio (1.2)")
    parser.add_argument("--ratio-max", type=float, help="ms-poe: largest position ratio (1.8)")
    parser.add_argument("--head-order", choices=["awareness", "sequential"], help="ms-poe head ordering")
    parser.add_argument(
        "--gqa", choices=["group", "per_query_head"], help="ms-poe: ratio per kv group or per query head"
    )
    parser.add_argument("--evidence-layers", default="upper", help="all | upper | lower | comma-separated indices")
    parser.add_argument("--evidence-query", default="question", choices=["last", "question"])


def method_options(args: argparse.Namespace) -> dict:
    names = {"ratio_min": args.ratio_min, "ratio_max": args.ratio_max, "head_order": args.head_order, "gqa": args.gqa}
    return {k: v for k, v in names.items() if v is not None}


def evidence_config(args: argparse.Namespace):
    from rag.evidence import EvidenceConfig

    layers = args.evidence_layers
    if layers not in ("all", "upper", "lower"):
        try:
            layers = [int(x) for x in layers.split(",")]
        except ValueError:
            raise MidlensError(f"--evidence-layers {layers!r}: use all, upper, lower or e.g. 20,21,22.") from None
    return EvidenceConfig(query=args.evidence_query, layers=layers)


def bar(value: float, top: float) -> str:
    filled = 0 if top <= 0 else max(0, round(BAR_WIDTH * value / top))
    return "#" * filled + "." * (BAR_WIDTH - filled)


def print_answer(answer) -> None:
    print(f"\nQ: {answer.question}\nA: {answer.text}\n")
    calibrated = answer.passages and answer.passages[0].calibrated is not None
    key = (lambda p: p.calibrated) if calibrated else (lambda p: p.evidence)
    top = max((key(p) for p in answer.passages), default=0.0)
    label = "calibrated evidence" if calibrated else "evidence"
    print(f"passages ranked by {label} (pos = position in the prompt, ret = retrieval cosine):")
    for p in answer.ranked():
        ret = "  -  " if p.retrieval_score is None else f"{p.retrieval_score:.3f}"
        print(
            f"{p.rank:>3}. [{bar(key(p), top)}] {key(p):+.4f}  pos {p.position:>2}  ret {ret}  {p.passage.title[:60]}"
        )
    t = answer.timings
    print(
        f"\n{answer.prompt_tokens} prompt tokens, {answer.generated_tokens} generated; "
        + ", ".join(f"{k} {v:.2f}s" for k, v in t.items())
    )
    if answer.dropped:
        print(f"note: {len(answer.dropped)} passages did not fit the window and were dropped.")


def cmd_ask(args: argparse.Namespace) -> int:
    from rag.pipeline import Pipeline

    pipe = Pipeline.from_corpus(
        args.corpus,
        model=args.model,
        method=args.method,
        top_k=args.top_k,
        index_type=args.index_type,
        evidence=evidence_config(args),
        **method_options(args),
    )
    pipe.truncate = args.truncate
    answer = pipe.ask(args.question, max_new_tokens=args.max_new_tokens, calibrate=not args.no_calibrate)
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, ensure_ascii=False))
    else:
        print_answer(answer)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="midlens", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    ask = sub.add_parser("ask", help="answer a question over a corpus, with per-passage evidence")
    ask.add_argument("question")
    ask.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    ask.add_argument("--top-k", type=int, default=5)
    ask.add_argument("--index-type", default="flat", choices=["flat", "ivf", "hnsw"])
    ask.add_argument("--max-new-tokens", type=int, default=48)
    ask.add_argument("--truncate", default="error", choices=["error", "drop_last"])
    ask.add_argument("--no-calibrate", action="store_true", help="skip the content-free (N/A) calibration pass")
    ask.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_method_args(ask)
    ask.set_defaults(func=cmd_ask)

    from demo.app import add_demo_parser
    from eval.bench import add_bench_parser
    from eval.cli import add_eval_parser

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_demo_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (MidlensError, ValueError) as err:
        print(f"midlens: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
