"""`midlens` command line: ask, methods, bench, eval, demo. The top of the stack: it composes every shell's
subcommands and nothing imports it."""

from __future__ import annotations

import argparse
import json
import sys

from midlens import __version__
from midlens.core.errors import InvalidArgumentError, MidlensError, PromptTooLongError
from midlens.core.names import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_PROMPT_STYLE,
    DEFAULT_RETRIEVAL,
    DEFAULT_TOP_K,
    PROMPT_STYLES,
    RETRIEVALS,
)
from midlens.rag.options import RETRIEVAL_HELP, Parser, add_model_args, positive_int

BAR_WIDTH = 24


def bar(value: float, top: float) -> str:
    filled = 0 if top <= 0 else max(0, round(BAR_WIDTH * value / top))
    return "#" * filled + "." * (BAR_WIDTH - filled)


def print_answer(answer, max_new_tokens: int | None = None) -> None:
    text = answer.text
    if not text and max_new_tokens == 0:
        text = "(none: --max-new-tokens 0 scores the passages without generating an answer)"
    elif not text:
        text = "(none: the model ended its answer before writing anything)"
    print(f"\nQ: {answer.question}\nA: {text}\n")
    calibrated = answer.passages and answer.passages[0].calibrated is not None

    def key(p):
        return p.score

    top = max((key(p) for p in answer.passages), default=0.0)
    label = "calibrated evidence" if calibrated else "evidence"
    print(f"passages ranked by {label} (pos = position in the prompt, ret = retrieval cosine):")
    for p in answer.ranked():
        ret = "  -  " if p.retrieval_score is None else f"{p.retrieval_score:.3f}"
        via = p.passage.metadata.get("linked_from")
        print(
            f"{p.rank:>3}. [{bar(key(p), top)}] {key(p):+.4f}  pos {p.position:>2}  ret {ret}  {p.passage.title[:60]}"
            + (f"  (named by {via[:40]})" if via else "")
        )
    t = answer.timings
    print(
        f"\n{answer.prompt_tokens} prompt tokens, {answer.generated_tokens} generated; "
        + ", ".join(f"{k} {v:.2f}s" for k, v in t.items())
    )
    if answer.dropped:
        print(f"note: {len(answer.dropped)} passages did not fit the window and were dropped.")


DESCRIPTION = (
    "RAG that stacks retrieved passages into one prompt, answers with a small RoPE model, and shows how much "
    "attention the answer paid to each passage. `midlens COMMAND --help` for a command's options and examples."
)
MAIN_EXAMPLES = """examples:
  midlens ask "Who directed Wings of Desire?"
  midlens methods
  midlens eval sweep --dataset hotpotqa --n 50 --out runs/h
  midlens demo
"""
ASK_EXAMPLES = """examples:
  midlens ask "Who directed Wings of Desire?"
  midlens ask "What does the report conclude?" --corpus docs/ --top-k 8 --method ms-poe
  midlens ask "Who directed Wings of Desire?" --json --device cpu > answer.json
"""
METHODS_EXAMPLES = """examples:
  midlens methods
  midlens ask "Who directed Wings of Desire?" --method "ms-poe(ratio_min=1.0, ratio_max=1.3)"
"""
DEMO_EXAMPLES = """examples:
  midlens demo
  midlens demo --corpus docs/ --method ms-poe --port 7861
"""


def prompt_error_for_cli(err: PromptTooLongError, args: argparse.Namespace) -> str:
    """The prompt builder speaks Python (top_k=, truncate='drop_last'); on the command line, say the options."""
    room = f"{err.window} tokens (the context window of {args.model} minus --max-new-tokens {args.max_new_tokens})"
    if err.part == "question":
        return (
            f"the question is too long: even without passages the prompt takes {err.prompt_tokens} tokens, more "
            f"than the {room}. Shorten the question, or use a --model with a longer context window."
        )
    if err.passages_that_fit == 0:
        return (
            f"not even the first of the {err.passages} retrieved passages fits in {room}. Use a --corpus with "
            "shorter passages, a lower --max-new-tokens, or a --model with a longer context window."
        )
    return (
        f"the {err.passages} retrieved passages do not fit in {room}; {err.passages_that_fit} would. Use "
        f"--top-k {err.passages_that_fit}, --truncate drop_last to keep the passages that fit, or a --model with a "
        "longer context window."
    )


def cmd_ask(args: argparse.Namespace) -> int:
    if not args.question.strip():  # before torch and the model load, which take seconds
        raise InvalidArgumentError('the question is empty: pass it in quotes, e.g. midlens ask "Who wrote X?"')
    from midlens.rag.options import check_device, chosen_model, evidence_config, method_spec

    method = method_spec(args)  # a typo in --method fails before the model loads
    args.model = chosen_model(args, method)  # the over-length message names it too
    check_device(args)
    from midlens.rag.pipeline import Pipeline

    pipe = Pipeline.from_corpus(
        args.corpus,
        model=args.model,
        method=method,
        top_k=args.top_k,
        index_type=args.index_type,
        evidence=evidence_config(args),
        device=args.device,
        dtype=args.dtype,
        prompt_style=args.prompt_style,
        retrieval=args.retrieval,
    )
    pipe.truncate = args.truncate
    try:
        answer = pipe.ask(args.question, max_new_tokens=args.max_new_tokens, calibrate=not args.no_calibrate)
    except PromptTooLongError as err:
        raise PromptTooLongError(
            prompt_error_for_cli(err, args),
            prompt_tokens=err.prompt_tokens,
            window=err.window,
            passages_that_fit=err.passages_that_fit,
            passages=err.passages,
            part=err.part,
        ) from None
    if args.json:
        print(json.dumps(answer.to_dict(), indent=2, ensure_ascii=False))
    else:
        print_answer(answer, args.max_new_tokens)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from midlens.generators.methods.registry import REGISTRY

    width = max(len(name) for name in REGISTRY) + 2  # every summary starts in one column, the longest name's too
    for method in REGISTRY.values():
        options = ", ".join(f"{k}={v!r}" for k, v in method.defaults.items()) or "no options"
        print(f"{method.name:<{width}}{method.summary}\n{'':<{width}}{options}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    # Parser: defaults in every --help (subparsers inherit the class). Only argparse-level modules are imported
    # while building it, so `midlens --help` takes a fraction of a second; torch loads inside the commands.
    parser = Parser(prog="midlens", description=DESCRIPTION, epilog=MAIN_EXAMPLES)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ask = sub.add_parser("ask", help="answer a question over a corpus, with per-passage evidence", epilog=ASK_EXAMPLES)
    ask.add_argument("question", help="the question to answer (quote it)")
    ask.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    ask.add_argument("--top-k", type=positive_int, default=DEFAULT_TOP_K, help="passages to retrieve and stack")
    ask.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVALS, help=RETRIEVAL_HELP)
    ask.add_argument("--index-type", default="flat", choices=["flat", "ivf", "hnsw"], help="faiss index for --corpus")
    ask.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="longest answer, in tokens")
    ask.add_argument(
        "--truncate", default="error", choices=["error", "drop_last"], help="when passages overflow the window"
    )
    ask.add_argument(
        "--prompt-style",
        default=DEFAULT_PROMPT_STYLE,
        choices=PROMPT_STYLES,
        help="instruction above the passages: litm (Liu et al.'s) or short (asks for the bare answer: crisper, "
        "but fewer right answers in our measurements)",
    )
    ask.add_argument("--no-calibrate", action="store_true", help="skip the content-free (N/A) calibration pass")
    ask.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_model_args(ask)
    ask.set_defaults(func=cmd_ask)

    methods = sub.add_parser("methods", help="list the registered methods and their options", epilog=METHODS_EXAMPLES)
    methods.set_defaults(func=cmd_methods)

    from midlens.demo.command import add_demo_parser
    from midlens.eval.bench import add_bench_parser
    from midlens.eval.cli import add_eval_parser
    from midlens.rag.cache_cli import add_cache_parser, add_index_parser
    from midlens.training.cli import add_heads_parser, add_moice_parser, add_train_parser

    add_bench_parser(sub)
    add_eval_parser(sub)
    add_demo_parser(sub)
    sub.choices["demo"].epilog = DEMO_EXAMPLES  # demo/ builds its parser; the examples live with the others here
    add_heads_parser(sub)
    add_train_parser(sub)
    add_moice_parser(sub)
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
