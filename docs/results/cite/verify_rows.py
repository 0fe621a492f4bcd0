"""Does `verify=True` keep the right citations? Verification checked against HotpotQA's labels, on stored rows.

`Generator.verify` keeps a citation where removing its passage lowers the answer sentence's log-probability by at
least `CitationConfig.margin` nats. This script runs that test on the answers of an `eval cite` run, under the rule
the library cites by for the run's model, method and `cite_evidence` (with a scorer's evidence from
`scorer_evidence.py score`, as section 12 grades it), then grades the verified citations against the labelled
supporting paragraphs beside all citations. The answers are not regenerated: a row's generated ids are scored as they
are (`answer_ids`, in rows written since it was added); an older row's text is tokenised again and must give as many
tokens as were generated (a row that does not is counted and left out).

    python docs/results/cite/verify_rows.py verify RUN_DIR OUT.jsonl QUESTIONS [SCORES.jsonl SCORER]   # resumable
    python docs/results/cite/verify_rows.py grade RUN_DIR OUT.jsonl[.gz]
    python docs/results/cite/verify_rows.py margin TRAIN_RUN TRAIN_OUT.jsonl[.gz] [EVAL_RUN EVAL_OUT.jsonl[.gz]]

`margin` chooses the margin on train answers and checks it on eval ones: each citation's drop is stored, so any margin
re-applies without scoring again.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
from pathlib import Path

from scorer_evidence import options_of, paired, pending, rows_of, rule_of, swapped
from tqdm import tqdm

from midlens.core.citation_rule import apply_rule
from midlens.eval.cite import gold_sets, layout, plan, prf, rule_scores

BATCH = 4


def cited(row: dict, rule: dict) -> list[list[int]]:
    """Per answer sentence, the passage positions the library's rule cites."""
    return [
        apply_rule(
            rule_scores(row, s, rule["evidence_weight"], rule["raw_evidence_weight"]),
            rule["max_sources"],
            rule["min_share"],
        )
        for s in row["sentences"]
    ]


def verify(run: Path, out: Path, questions: int, scores: Path | None, scorer: str | None) -> None:
    from midlens.generators.answering.citations import CitationConfig
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.scheduling import generate_all
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.loading import load_model

    options = options_of(run)
    config, _, examples = plan(options)
    (method,) = config["methods"]
    rows = rows_of(run)
    if scores is not None:
        _, with_scorer = swapped(rows, scores)
        rows = {(r["example_id"], r["position"]): r for r in with_scorer}
    rule = rule_of(run, scorer)
    margin = CitationConfig.measured(options.model, method).margin
    todo = pending(out, examples[:questions], config["positions"], rows)
    gen = Generator(load_model(options.model), method=method, evidence=EvidenceConfig(**config["evidence"]))
    with out.open("a") as f:
        for ex, p in tqdm(todo, desc="verify"):
            row = rows[(ex.id, p)]
            ids = row.get("answer_ids") or gen.tokenizer(row["prediction"], add_special_tokens=False)["input_ids"]
            line: dict = {"example_id": ex.id, "position": p, "rule": rule, "margin": margin}
            bounds = [0]
            for s in row["sentences"]:
                bounds.append(bounds[-1] + s["tokens"])
            if len(ids) != row["answer_tokens"] or bounds[-1] != len(ids):
                line["skipped"] = f"{len(ids)} tokens again, {row['answer_tokens']} generated"
            else:
                per_sentence = cited(row, rule)
                removed = sorted({q for qs in per_sentence for q in qs})
                passages = layout(ex, p, options.seed)
                prompts = [
                    gen.prompt(
                        ex.question,
                        [x for j, x in enumerate(passages, start=1) if j != q],
                        options.max_new_tokens,
                        style=options.prompt_style,
                    )
                    for q in [None, *removed]
                ]
                assert prompts[0].num_tokens == row["prompt_tokens"], (ex.id, p)
                answers = generate_all(gen, prompts, BATCH, [ids] * len(prompts), max_new_tokens=0, calibrate=False)
                lps = {q: a.reference_token_logprobs for q, a in zip([None, *removed], answers, strict=True)}
                line["citations"] = [
                    {"sentence": i, "position": q, "drop": drop, "verified": drop >= margin}
                    for i, qs in enumerate(per_sentence)
                    for q in qs
                    for drop in [sum(lps[None][bounds[i] : bounds[i + 1]]) - sum(lps[q][bounds[i] : bounds[i + 1]])]
                ]
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())


def verified_gap(graded: list[tuple[dict, dict]], seed: int = 0) -> str:
    """Right-answer rate of answers whose every citation verified minus that of answers with none verified, with a
    95 % bootstrap interval over questions (an answer's three positions are resampled together)."""
    by: dict[str, list[tuple[str, float]]] = {}
    for d, row in graded:
        verified = [c["verified"] for c in d["citations"]]
        if not verified:  # an answer that cites nothing has nothing to verify
            continue
        group = "all" if all(verified) else "none" if not any(verified) else "some"
        by.setdefault(row["example_id"], []).append((group, row["em"]))

    def gap(questions: list[str]) -> float | None:
        cells = [x for q in questions for x in by[q]]
        all_, none = [e for g, e in cells if g == "all"], [e for g, e in cells if g == "none"]
        return 100 * (sum(all_) / len(all_) - sum(none) / len(none)) if all_ and none else None

    rng = random.Random(seed)
    questions = sorted(by)
    samples = sorted(g for g in (gap(rng.choices(questions, k=len(questions))) for _ in range(2000)) if g is not None)
    point = gap(questions)
    if point is None or not samples:
        return "n/a (no answer with all or none verified)"
    return f"{point:+.1f} [{samples[len(samples) // 40]:+.1f}, {samples[-(len(samples) // 40) - 1]:+.1f}]"


def verified_lines(out: Path) -> list[dict]:
    text = gzip.decompress(out.read_bytes()).decode() if out.suffix == ".gz" else out.read_text()
    return [json.loads(x) for x in text.splitlines()]


MARGINS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)


def cited_drops(run: Path, out: Path) -> list[tuple[list[float], dict]]:
    """Per answer that cites something: its citations' drops and its row."""
    rows = rows_of(run)
    return [
        ([c["drop"] for c in d["citations"]], rows[(d["example_id"], d["position"])])
        for d in verified_lines(out)
        if "skipped" not in d and d["citations"]
    ]


def youden(answers: list[tuple[list[float], dict]], margin: float) -> tuple[float, float, float]:
    """How well "no citation verified" flags a wrong answer at this margin: Youden's J (the share of wrong answers
    flagged minus the share of right ones), and both shares, in %."""
    wrong = [max(drops) < margin for drops, row in answers if row["em"] <= 0]
    right = [max(drops) < margin for drops, row in answers if row["em"] > 0]
    hit = 100 * sum(wrong) / len(wrong) if wrong else 0.0
    false = 100 * sum(right) / len(right) if right else 0.0
    return hit - false, hit, false


def j_interval(
    answers: list[tuple[list[float], dict]], margin: float, than: float | None = None, seed: int = 0
) -> tuple[str, float]:
    """J (minus J at margin `than`, paired) with a 95 % bootstrap interval over questions (an answer's positions are
    resampled together), and the interval's lower end."""
    by: dict[str, list] = {}
    for a in answers:
        by.setdefault(a[1]["example_id"], []).append(a)

    def j(sample: list) -> float:
        return youden(sample, margin)[0] - (0.0 if than is None else youden(sample, than)[0])

    questions = sorted(by)
    rng = random.Random(seed)
    samples = sorted(j([a for q in rng.choices(questions, k=len(questions)) for a in by[q]]) for _ in range(2000))
    return f"{j(answers):+.1f} [{samples[49]:+.1f}, {samples[1949]:+.1f}]", samples[49]


def choose_margin(train_run: Path, train_out: Path, eval_run: Path | None, eval_out: Path | None) -> None:
    """The margin under which an answer none of whose citations verifies is most likely a wrong one (Youden's J of
    that flag, on train answers), beside the default margin; then both on eval answers. The best margin replaces the
    default only where it beats it on train with a paired interval above zero (README, section 15, says when that bar
    was set)."""
    from midlens.generators.answering.citations import CitationConfig

    default = CitationConfig().margin
    train = cited_drops(train_run, train_out)
    print(f"train: {len(train)} answers citing something, {sum(r['em'] > 0 for _, r in train)} right")
    print("| margin, nats | J | wrong answers flagged % | right answers flagged % |")
    print("|---|---|---|---|")
    for m in MARGINS:
        j, hit, false = youden(train, m)
        print(f"| {m:g} | {j:+.1f} | {hit:.1f} | {false:.1f} |")
    # Ties go to the smaller margin: it drops fewer citations to the `[n?]` mark.
    best = max(MARGINS, key=lambda m: (round(youden(train, m)[0], 6), -m))
    gain, low = j_interval(train, best, default)
    print(f"best on train: {best:g} nats (J {j_interval(train, best)[0]})")
    print(f"default: {default:g} nats (J {j_interval(train, default)[0]}); best minus default, paired: {gain}")
    print(f"verdict: {f'ship {best:g} nats' if low > 0 and best != default else 'keep the default'}")
    if eval_run is not None and eval_out is not None:
        held = cited_drops(eval_run, eval_out)
        print(f"eval: {len(held)} answers citing something, {sum(r['em'] > 0 for _, r in held)} right")
        for m in sorted({best, default}):
            j, hit, false = youden(held, m)
            print(f"  margin {m:g}: J {j_interval(held, m)[0]}, wrong flagged {hit:.1f} %, right flagged {false:.1f} %")
        print(f"  best minus default, paired: {j_interval(held, best, default)[0]}")


def grade(run: Path, out: Path) -> None:
    rows = rows_of(run)
    lines = verified_lines(out)
    skipped = [d for d in lines if "skipped" in d]
    graded = [(d, rows[(d["example_id"], d["position"])]) for d in lines if "skipped" not in d]
    print(f"{len(lines)} answers, {len(skipped)} left out (tokenised again to another length)")
    print(f"rule: {graded[0][0]['rule']}, margin {graded[0][0]['margin']} nats")
    # Verification as a hint of the answer's correctness: how often an answer is right given how many of its
    # citations verify.
    right: dict[int, list[float]] = {}
    for d, row in graded:
        if not d["citations"]:
            continue
        right.setdefault(sum(c["verified"] for c in d["citations"]), []).append(row["em"])
    for count, ems in sorted(right.items()):
        print(f"  answers with {count} verified citations: {len(ems)}, right {100 * sum(ems) / len(ems):.1f} %")
    print(f"  every citation verified minus none verified, right %: {verified_gap(graded)}")

    def f1(kept: list[dict], row: dict) -> float:
        return 100 * prf({str(c["position"]) for c in kept}, gold_sets(row)[0])["f1"]

    for subset, pick in (("all answers", lambda row: True), ("right answers", lambda row: row["em"] > 0)):
        chosen = [(d, row) for d, row in graded if pick(row)]
        if not chosen:
            continue
        every = [f1(d["citations"], row) for d, row in chosen]
        verified = [f1([c for c in d["citations"] if c["verified"]], row) for d, row in chosen]
        rows_ = [row for _, row in chosen]
        cites = [(c, row) for d, row in chosen for c in d["citations"]]
        kept = [(c, row) for c, row in cites if c["verified"]]
        dropped = [(c, row) for c, row in cites if not c["verified"]]

        def supporting(pairs: list) -> str:
            share = sum(str(c["position"]) in gold_sets(row)[0] for c, row in pairs) / len(pairs) if pairs else 0
            return f"{100 * share:.1f} % of {len(pairs)}"

        print(f"\n{subset} (n = {len(chosen)}, {len({r['example_id'] for r in rows_})} questions)")
        print(f"  citations verified: {len(kept)} of {len(cites)}")
        print(f"  supporting paragraphs among verified citations: {supporting(kept)}")
        print(f"  supporting paragraphs among unverified citations: {supporting(dropped)}")
        print(f"  passage F1, all citations: {sum(every) / len(every):.1f}")
        # The answer-bearing paragraph sits at the row's position; the other supporting one is HotpotQA's bridge.
        for kind, test in (
            ("answer-bearing paragraph", lambda c, row: c["position"] == row["position"]),
            (
                "other supporting paragraph",
                lambda c, row: c["position"] != row["position"] and str(c["position"]) in gold_sets(row)[0],
            ),
            ("distractor", lambda c, row: str(c["position"]) not in gold_sets(row)[0]),
        ):
            of = [c for c, row in cites if test(c, row)]
            rate = 100 * sum(c["verified"] for c in of) / len(of) if of else 0.0
            median = sorted(c["drop"] for c in of)[len(of) // 2] if of else 0.0
            print(f"    {kind}: cited {len(of)} times, verified {rate:.1f} %, median drop {median:.2f} nats")
        difference = paired(verified, every, rows_)
        print(f"  passage F1, verified only: {sum(verified) / len(verified):.1f}; paired {difference}")
        for position in sorted({row["position"] for row in rows_}):
            at = [i for i, row in enumerate(rows_) if row["position"] == position]
            a, b = [every[i] for i in at], [verified[i] for i in at]
            print(
                f"    gold@{position}: {sum(a) / len(a):.1f} -> {sum(b) / len(b):.1f} "
                f"(paired {paired(b, a, [rows_[i] for i in at])})"
            )


if __name__ == "__main__":
    if sys.argv[1] == "verify":
        extra = sys.argv[5:7]
        verify(
            Path(sys.argv[2]),
            Path(sys.argv[3]),
            int(sys.argv[4]),
            Path(extra[0]) if extra else None,
            extra[1] if extra else None,
        )
    elif sys.argv[1] == "margin":
        held_out = [Path(x) for x in sys.argv[4:6]]
        choose_margin(Path(sys.argv[2]), Path(sys.argv[3]), *(held_out or [None, None]))
    else:
        grade(Path(sys.argv[2]), Path(sys.argv[3]))
