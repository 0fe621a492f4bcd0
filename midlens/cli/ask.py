"""`midlens ask`: retrieve, stack, answer one question, and show what each sentence of the answer cites and the
evidence each passage got."""

from __future__ import annotations

import argparse
import json
import sys

from midlens.cli.options import (
    RETRIEVAL_HELP,
    add_cite_evidence_arg,
    add_model_args,
    prompt_error_for_cli,
)
from midlens.core.defaults import DEFAULT_RETRIEVAL, RETRIEVALS
from midlens.core.errors import MidlensError, PromptTooLongError
from midlens.core.validation import check_question
from midlens.rag.option_fields import add_arguments, from_arguments

EXAMPLES = """examples:
  midlens ask "Who directed Wings of Desire?"
  midlens ask "What does the report conclude?" --corpus docs/ --top-k 8 --method ms-poe
  midlens ask "Who directed Wings of Desire?" --verify      # check each citation: [1?] marks one that fails
  midlens ask "Who directed Wings of Desire?" --restack     # MuDAF's evidence puts the strongest passages where
                                                            # the model reads best, then --method answers
  midlens ask "Who directed Wings of Desire?" --model smollm2-135m --no-restack   # its default restacks: not now
  midlens ask "Who directed Wings of Desire?" --json --device cpu > answer.json
"""
BAR_WIDTH = 24
QUOTE_WIDTH = 160  # characters of a cited sentence shown under the answer


def add_parser(sub) -> None:
    ask = sub.add_parser("ask", help="answer a question over a corpus, with per-passage evidence", epilog=EXAMPLES)
    ask.add_argument("question", help="the question to answer (quote it)")
    ask.add_argument("--corpus", help="folder of .txt/.md or a .jsonl; default: embedded HotpotQA paragraphs")
    ask.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVALS, help=RETRIEVAL_HELP)
    ask.add_argument("--index-type", default="flat", choices=["flat", "ivf", "hnsw"], help="faiss index for --corpus")
    # The answering options (rag/options.py's fields, spelt by rag/option_fields.py), then those shared with others.
    add_arguments(ask)
    add_cite_evidence_arg(
        ask,
        "choose the cited passages with this method's evidence of the prompt (one more prefill) instead of the "
        "answering pass's own: mudaf raised the default model's citation F1 on HotpotQA (docs/results/cite, "
        "section 12)",
    )
    ask.add_argument("--json", action="store_true", help="print the full result as JSON")
    add_model_args(ask)
    ask.set_defaults(func=run)


def answer_options(args: argparse.Namespace):
    """The flags of `ask` as the AnswerOptions they spell (checked there, before torch loads)."""
    return from_arguments(args, method=args.method, cite_evidence=args.cite_evidence)


def run(args: argparse.Namespace) -> int:
    check_question(args.question)  # before torch and the model load, which take seconds
    options = answer_options(args)
    from midlens.cli.options import check_device, chosen_model, evidence_config, method_spec

    method = method_spec(args)  # a typo in --method's options fails before the model loads
    args.model = chosen_model(args, method)  # the over-length message names it too
    check_device(args)
    from midlens.rag.pipeline import Pipeline

    pipe = Pipeline.from_corpus(
        args.corpus,
        model=args.model,
        options=options.replace(method=method.spec()),
        index_type=args.index_type,
        evidence=evidence_config(args),
        device=args.device,
        dtype=args.dtype,
        retrieval=args.retrieval,
    )
    try:
        answer = pipe.ask(args.question)
    except PromptTooLongError as err:
        raise MidlensError(prompt_error_for_cli(err, args)) from None
    if args.verify and not any(c.sources for c in answer.citations):
        print("note: --verify: the answer cites no passage, so there was nothing to verify.", file=sys.stderr)
    if args.json:
        from midlens.rag.pipeline import marked_answer

        # The record as Answer.to_dict writes it (citations: `span` in `text`, each source's `sentence` in its
        # passage's `text`, both character offsets), plus the text as printed, with its markers.
        record = {**answer.to_dict(), "marked_text": marked_answer(answer).text}
        print(json.dumps(record, indent=2, ensure_ascii=False))
    else:
        from midlens.core.device import dtype_name  # here: the parser must not import torch (--help stays fast)

        loaded = pipe.generator.loaded
        print_answer(answer, args.max_new_tokens, f"{loaded.device.type}, {dtype_name(loaded.dtype)}")
    return 0


def bar(value: float, top: float) -> str:
    filled = 0 if top <= 0 else max(0, round(BAR_WIDTH * value / top))
    return "#" * filled + "." * (BAR_WIDTH - filled)


def quote(text: str, width: int = QUOTE_WIDTH) -> str:
    """A cited sentence on one line, cut to `width` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1].rstrip() + "\u2026"


def _numbered(answer) -> str:
    """What a passage's number means: a restacked answer keeps the retrieved numbering, not its prompt's."""
    return "position in the prompt" if answer.restack is None else "position as retrieved"


def print_citations(answer) -> None:
    """Under the answer: each cited passage (its marker = its prompt position) with the sentence it is cited for,
    its share of the citing sentence's attention and, once verified, the log-probability the sentence loses
    without it; a passage a flagged sentence needs (`generators.answering.check.citation_check`: SHAPES) is listed
    apart, as shaping that sentence's wording, not as verifying it."""
    from midlens.generators.answering.check import FAILED, SHAPES, VERIFIED, check_words, citation_check, doubted
    from midlens.generators.answering.citations import CitedSource

    # (position, passage sentence, shaping a flagged sentence) -> (answer sentence, source, check) of each citing
    cited: dict[tuple[int, tuple[int, int] | None, bool], list[tuple[int, CitedSource, str]]] = {}
    for n, (citation, doubt) in enumerate(zip(answer.citations, doubted(answer), strict=True), start=1):
        for source in citation.sources:
            kind = citation_check(source, doubt)
            cited.setdefault((source.position, source.sentence, kind == SHAPES), []).append((n, source, kind))
    if not cited:
        return
    print(f"cited (n = {_numbered(answer)}; share of the sentence's attention to passages):")
    for (position, sentence, _), entries in sorted(cited.items(), key=lambda item: (item[0][0], item[0][2])):
        passage = answer.passages[position - 1].passage
        sources = [source for _, source, _ in entries]
        kinds = {kind for _, _, kind in entries}
        best = max(sources, key=lambda s: s.score)
        checks = [s for s in sources if s.verified is not None]
        note = f"share {best.score:.2f}"
        if checks:
            drop = max(s.logprob_drop for s in checks)
            kind = SHAPES if SHAPES in kinds else VERIFIED if VERIFIED in kinds else FAILED
            note += ", " + check_words(kind, drop, sorted({n for n, _, k in entries if k == SHAPES}))
        marker = f"[{position}{'?' if checks and not any(s.verified for s in checks) else ''}]"
        said = passage.text[sentence[0] : sentence[1]] if sentence is not None else passage.title
        print(f"  {marker:<5} {passage.title[:60]}  ({note})")
        print(f'        "{quote(said)}"')
    checked = [s for entries in cited.values() for _, s, _ in entries if s.verified is not None]
    if checked and not any(s.verified for s in checked):
        # Measured (docs/results/cite, sections 14-15): the default model's such answers were right 16 % of the time
        # against 55 % for fully verified ones (40 eval questions).
        print("  none verified: the answer needs none of the passages it cites; check it against the sources.")
    print()


def print_answer(answer, max_new_tokens: int | None = None, precision: str = "") -> None:
    """`precision`: where and in which dtype the model ran ("cpu, bfloat16"), printed with the timings."""
    from midlens.rag.pipeline import marked_answer

    text = marked_answer(answer).text
    if not text and max_new_tokens == 0:
        text = "(none: --max-new-tokens 0 scores the passages without generating an answer)"
    elif not text:
        text = "(none: the model ended its answer before writing anything)"
    print(f"\nQ: {answer.question}\nA: {text}")
    if answer.support is not None:
        # First, under the answer: whether to trust it (generators.answering.support; calibrated on the train split).
        checked = " (citations verified)" if answer.support.verified else ""
        print(f"   support: {answer.support.words}{checked}")
    if answer.withheld is not None:
        print(f"   withheld answer: {quote(answer.withheld['text'])}")
    print()
    print_citations(answer)
    if answer.restack is not None:
        r = answer.restack
        rounds = f"{r['rounds']} round{'s' if r['rounds'] > 1 else ''}"
        print(
            f"restacked by {r['scorer']} evidence ({rounds}): the prompt held passages "
            f"{', '.join(map(str, r['order']))} in slots 1..{len(r['order'])} (numbers below: as retrieved; "
            "--no-restack answers them in that order)\n"
        )
    calibrated = answer.passages and answer.passages[0].calibrated is not None
    top = max((p.score for p in answer.passages), default=0.0)
    label = "calibrated evidence" if calibrated else "evidence"
    print(f"passages ranked by {label} (pos = {_numbered(answer)}, ret = retrieval cosine):")
    for p in answer.ranked():
        ret = "  -  " if p.retrieval_score is None else f"{p.retrieval_score:.3f}"
        via = p.passage.metadata.get("linked_from")
        print(
            f"{p.rank:>3}. [{bar(p.score, top)}] {p.score:+.4f}  pos {p.position:>2}  ret {ret}  {p.passage.title[:60]}"
            + (f"  (named by {via[:40]})" if via else "")
        )
    t = answer.timings
    print(
        f"\n{answer.prompt_tokens} prompt tokens, {answer.generated_tokens} generated; "
        + ", ".join(f"{k} {v:.2f}s" for k, v in t.items())
        + (f"; {precision}" if precision else "")
    )
    if answer.dropped:
        print(f"note: {len(answer.dropped)} passages did not fit the window and were dropped.")
