"""`midlens` command line: ask, methods, bench, eval, demo. The top of the stack: it composes every shell's
subcommands and nothing imports it."""

from __future__ import annotations

import argparse
import json
import sys

from core.errors import MidlensError
from rag.options import add_model_args

BAR_WIDTH = 24


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
    from rag.options import check_device, evidence_config, method_spec
    from rag.pipeline import Pipeline

    method = method_spec(args)  # a typo in --method fails before the model loads
    check_device(args)
    pipe = Pipeline.from_corpus(
        args.corpus,
        model=args.model,
        method=method,
        top_k=args.top_k,
        index_type=args.index_type,
        evidence=evidence_config(args),
        device=args.device,
        dtype=args.dtype,
    )
    pipe.truncate = args.truncate
    answer = pipe.ask(args.question, max_new_tokens=args.max_new_tokens, calibrate=not args.no_calibrate)
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, ensure_ascii=False))
    else:
        print_answer(answer)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from generators.registry import REGISTRY

    for method in REGISTRY.values():
        options = ", ".join(f"{k}={v!r}" for k, v in method.defaults.items()) or "no options"
        print(f"{method.name:<12} {method.summary}\n{'':<12} {options}")
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
    add_model_args(ask)
    ask.set_defaults(func=cmd_ask)

    methods = sub.add_parser("methods", help="list the registered methods and their options")
    methods.set_defaults(func=cmd_methods)

    from demo.app import add_demo_parser
    from eval.bench import add_bench_parser
    from eval.cli import add_eval_parser
    from rag.cache_cli import add_cache_parser, add_index_parser

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_demo_parser(sub)
    add_cache_parser(sub)
    add_index_parser(sub)
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
