"""`midlens check`: read an answer another model (or a person) wrote over the passages, and show which passage each of
its sentences rests on and which may not be supported."""

from __future__ import annotations

import argparse
import json
import sys

from midlens.cli.options import add_model_args
from midlens.core.defaults import CHECK_MODEL
from midlens.core.errors import InvalidArgumentError
from midlens.core.validation import check_question

EXAMPLES = """examples:
  midlens check "Who directed Wings of Desire?" --answer "Wim Wenders directed it in 1987."
  midlens check "What does the report conclude?" --answer "$(cat answer.txt)" --corpus docs/ --no-verify
  midlens check "Who wrote it?" --answer "Ada Lovelace." --passages passages.jsonl --json
"""


def fits(args: argparse.Namespace, passages: list | None) -> None:
    """Pipeline.check's limit (the answer within the model's context window) and, over --passages, the prompt's,
    applied with the tokenizer alone before the model loads; a long check says so before it starts."""
    from midlens.generators.answering.check_limits import LONG_CHECK_TOKENS, answer_tokens, tokenizer_and_window
    from midlens.generators.models.loading import refuse_unrunnable

    refuse_unrunnable(args.model)  # a folder of a family midlens cannot run: its own refusal, not a tokenizer's
    read = tokenizer_and_window(args.model)
    if read is None:
        return
    tokenizer, window = read
    tokens = answer_tokens(tokenizer, args.answer, window, args.model)
    over = "the retrieved passages"
    if passages is not None:
        from midlens.generators.models.prompt import build_prompt

        prompt = build_prompt(tokenizer, passages, args.question, window - tokens, args.truncate, args.prompt_style)
        over = f"a {prompt.num_tokens}-token prompt"
    if tokens >= LONG_CHECK_TOKENS:
        verify = ", then one more per passage a sentence cites (--verify)" if args.verify else ""
        print(
            f"checking a {tokens}-token answer: one pass over it after {over}{verify}; on a CPU a check this long "
            "takes minutes or more.",
            file=sys.stderr,
            flush=True,
        )


def add_parser(sub) -> None:
    check = sub.add_parser(
        "check", help="cite and check an answer written elsewhere against the passages", epilog=EXAMPLES
    )
    check.add_argument("question", help="the question the answer answers (quote it)")
    check.add_argument("--answer", required=True, help="the answer to check (quote it)")
    source = check.add_mutually_exclusive_group()
    source.add_argument("--corpus", help="folder of .txt/.md or a .jsonl to retrieve from; default: embedded HotpotQA")
    source.add_argument(
        "--passages",
        help="the passages the answer was written over (.jsonl of {title, text}, a .txt/.md or a folder), "
        "stacked in that order, no retrieval",
    )
    # CheckOptions' fields, spelt from their OptionInfo as every shell of the check path spells them.
    from midlens.rag.check_options import CheckOptions
    from midlens.rag.option_fields import add_arguments

    add_arguments(check, options=CheckOptions)
    check.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_model_args(check, default_model=CHECK_MODEL)
    check.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_question(args.question)  # before torch and the model load
    if not args.answer.strip():
        raise InvalidArgumentError('the answer to check is empty: pass its text with --answer "...".')
    passages = None
    if args.passages is not None:  # the file the user gave, named as they gave it, before seconds of imports
        from midlens.core.passage import Passage
        from midlens.retrievers.corpus import read_documents

        docs = read_documents(args.passages, name="--passages")
        passages = [Passage(text=d["text"], title=d["title"], id=d["id"]) for d in docs]
    from midlens.cli.options import check_device, chosen_model, evidence_config, method_spec
    from midlens.rag.check_options import CheckOptions
    from midlens.rag.option_fields import from_arguments

    method = method_spec(args)
    args.model = chosen_model(args, method, CHECK_MODEL)
    check = from_arguments(args, CheckOptions, model=args.model)
    check_device(args)
    fits(args, passages)
    from midlens.generators.answering.check import NO_SUPPORT_MODEL, flagged, sentence_support, support_lines
    from midlens.rag.options import AnswerOptions
    from midlens.rag.pipeline import Pipeline, marked_answer

    if passages is not None:
        from midlens.generators import Generator

        generator = Generator(
            args.model, method=method, evidence=evidence_config(args), device=args.device, dtype=args.dtype
        )
        pipe = Pipeline(None, generator)
    else:
        pipe = Pipeline.from_corpus(
            args.corpus,
            model=args.model,
            options=AnswerOptions(method=method.spec(), top_k=check.top_k),
            evidence=evidence_config(args),
            device=args.device,
            dtype=args.dtype,
        )
    answer = pipe.check(args.question, args.answer, passages, check)
    doubts = flagged(answer)
    if args.json:
        record = {
            **answer.to_dict(),
            "marked_text": marked_answer(answer).text,
            "unsupported": [c.span for c, _ in doubts],
            "unsupported_why": [why for _, why in doubts],
            "sentence_support": sentence_support(answer),
            "support_note": NO_SUPPORT_MODEL if answer.support is None else None,
        }
        print(json.dumps(record, indent=2, ensure_ascii=False))
        return 0
    from midlens.cli.ask import print_citations

    print(f"\nQ: {answer.question}\nA: {marked_answer(answer).text}")
    for line in support_lines(answer):
        print(f"   {line}")
    if doubts:
        print("   the sentences that may not be supported:")
        for citation, why in doubts:
            print(f"     - {answer.text[citation.span[0] : citation.span[1]]}  ({why})")
    elif not args.verify:
        print("   every sentence cites a passage; without --no-verify the check says whether it needs it")
    else:
        print("   every sentence rests on a passage it needs (verified)")
    print()
    print_citations(answer)
    print(
        f"{answer.prompt_tokens} prompt tokens, {answer.generated_tokens} answer tokens; "
        + ", ".join(f"{k} {v:.2f}s" for k, v in answer.timings.items())
    )
    if answer.dropped:
        print(f"note: {len(answer.dropped)} passages did not fit the window and were dropped.", file=sys.stderr)
    return 0
