"""`midlens eval cite` and `midlens eval cite-cost`: citations graded against HotpotQA's supporting facts, and what
citations cost (midlens.eval.cite, midlens.eval.cite_cost).

midlens eval cite --n 100 --methods baseline,mudaf --max-words 60 --out runs/cite
midlens eval cite --split train --n 40 --out runs/cite-train        # choose the citation rule here
midlens eval cite --n 10 --drops 1,2 --ablations 32 --no-prompted --out runs/cite-drops
midlens eval cite --n 200 --shard 0/2 --out runs/cite & midlens eval cite --n 200 --shard 1/2 --out runs/cite
midlens eval merge runs/cite --out runs/cite                        # one process per core, then one file
midlens eval cite-cost --n 5 --out runs/cite-cost.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from midlens.cli.options import (
    add_cite_evidence_arg,
    add_device_args,
    add_evidence_args,
    check_cite_evidence,
    positive_int,
)
from midlens.core.defaults import DEFAULT_PROMPT_STYLE, EVAL_MODEL, PROMPT_STYLES

EXAMPLES = """examples:
  midlens eval cite --n 100 --methods baseline,mudaf --out runs/cite
  midlens eval cite --split train --n 40 --out runs/cite-train
  midlens eval cite --n 10 --drops 1,2 --ablations 32 --no-prompted --out runs/cite-drops
  midlens eval report runs/cite --out runs/cite
"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _fraction(text: str) -> float:
    """A rule's share or weight: refused at parse time, as CitationConfig refuses it, not after the model loads."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number between 0 and 1") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number between 0 and 1")
    return value


def add_parsers(esub) -> None:
    """Register `cite` and `cite-cost` under `midlens eval`."""
    ct = esub.add_parser("cite", help="citations against HotpotQA's supporting facts, with baselines", epilog=EXAMPLES)
    ct.add_argument("--out", required=True, type=Path, help="run directory (created; resumed when it exists)")
    ct.add_argument("--model", default=EVAL_MODEL, help="registry name or local HF folder")
    add_device_args(ct)
    ct.add_argument("--methods", default="baseline", help="comma-separated method specs")
    ct.add_argument("--n", type=positive_int, help="number of questions (seeded subsample; default: all)")
    ct.add_argument("--seed", type=int, default=0, help="subsampling and layout seed")
    ct.add_argument("--split", default="eval", choices=["eval", "train"], help="train: for choosing the rule")
    ct.add_argument("--max-words", type=int, default=100, help="clip paragraphs to ~N words (0: whole)")
    ct.add_argument("--positions", type=_ints, default=(), help="1-based answer-paragraph positions; default 1,K/2,K")
    ct.add_argument("--max-new-tokens", type=int, default=24, help="longest answer, in tokens")
    ct.add_argument("--prompt-style", default=DEFAULT_PROMPT_STYLE, choices=PROMPT_STYLES)
    # The rule's defaults are CitationConfig's (the library's), so a run grades what the library cites.
    measured = " (default: the rule measured for the model and method, else {})"
    ct.add_argument(
        "--max-sources", type=positive_int, help="the rule: passages cited per sentence at most" + measured.format(3)
    )
    ct.add_argument(
        "--min-share", type=_fraction, help="the rule: share of the top passage's score to cite" + measured.format(0.7)
    )
    ct.add_argument(
        "--evidence-weight",
        type=_fraction,
        help="the rule: weight of the prompt's evidence in the score" + measured.format(1.0),
    )
    ct.add_argument(
        "--raw-evidence-weight",
        type=_fraction,
        help="the rule: weight of the prompt's raw (uncalibrated) evidence" + measured.format(0.0),
    )
    add_cite_evidence_arg(
        ct,
        "the rule blends in this method's evidence of the prompt, read in one more prefill (rows keep it as "
        "evidence_from), and the rule measured with it applies: what `ask --cite-evidence` cites",
    )
    ct.add_argument("--no-prompted", action="store_true", help="skip the prompted-citation pass")
    ct.add_argument("--drops", type=_ints, default=(), help="k of the top-k log-probability drops, e.g. 1,2")
    ct.add_argument("--ablations", type=int, default=0, help="random ablations of the ContextCite-style reference")
    ct.add_argument("--batch-size", type=positive_int, default=1, help="ablated prompts scored at once")
    ct.add_argument("--shard", help="i/n: run only every n-th question starting at i (0-based; join with eval merge)")
    ct.add_argument("--limit", type=int, help="stop after this many new units")
    ct.add_argument("--no-progress", action="store_true")
    add_evidence_args(ct)
    ct.set_defaults(func=run)

    cc = esub.add_parser("cite-cost", help="generation with citations against without: time and peak memory")
    cc.add_argument("--out", required=True, type=Path, help="JSON file written")
    cc.add_argument("--model", default=EVAL_MODEL)
    cc.add_argument("--n", type=positive_int, default=5, help="questions (eval split)")
    cc.add_argument("--repeats", type=positive_int, default=2, help="alternating timings per question")
    cc.add_argument("--max-words", type=int, default=100)
    cc.add_argument("--max-new-tokens", type=int, default=24)
    add_cite_evidence_arg(
        cc, "the citing generator blends in this method's evidence (one more prefill per answer), as ask's option"
    )
    cc.set_defaults(func=cost)


def run(args: argparse.Namespace) -> int:
    from midlens.cli.options import evidence_config
    from midlens.core.method_spec import split_top_level
    from midlens.eval import cite, runner

    check_cite_evidence(args)
    shard = runner.parse_shard(args.shard)
    options = cite.CiteOptions(
        out=args.out,
        model=args.model,
        methods=tuple(split_top_level(args.methods)),
        device=args.device,
        dtype=args.dtype,
        evidence=evidence_config(args),
        n=args.n,
        seed=args.seed,
        split=args.split,
        max_words=args.max_words,
        positions=args.positions,
        max_new_tokens=args.max_new_tokens,
        prompt_style=args.prompt_style,
        max_sources=args.max_sources,
        min_share=args.min_share,
        evidence_weight=args.evidence_weight,
        raw_evidence_weight=args.raw_evidence_weight,
        prompted=not args.no_prompted,
        cite_evidence=args.cite_evidence,
        drops=args.drops,
        ablations=args.ablations,
        batch_size=args.batch_size,
        shard=shard,
        limit=args.limit,
        progress=not args.no_progress,
    )
    rows = cite.run(options)
    print(f"{len(rows)} results in {options.out / runner.results_name(shard)}")
    return 0


def cost(args: argparse.Namespace) -> int:
    from midlens.eval.cite_cost import measure

    check_cite_evidence(args)
    result = measure(
        args.model, args.n, args.repeats, args.max_words, args.max_new_tokens, args.out, args.cite_evidence
    )
    print(
        f"generation with citations: {result['ratio']:.3f}x the wall time, {result['cpu_ratio']:.3f}x the CPU time "
        f"of generation without; streamed (each sentence cited as it ends): {result['stream_ratio']:.3f}x the wall "
        f"time, first text delta {result['first_delta_ratio']:.3f}x later; written to {args.out}"
    )
    return 0
