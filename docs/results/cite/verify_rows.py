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
    from midlens.generators.citations import CitationConfig
    from midlens.generators.evidence import EvidenceConfig
    from midlens.generators.generator import Generator
    from midlens.generators.loading import load_model
    from midlens.generators.scheduling import generate_all

    options = options_of(run)
    config, _, examples = plan(options)
    (method,) = config["methods"]
    rows = rows_of(run)
    if scores is not None:
        _, with_scorer = swapped(rows, scores)
        rows = {(r["example_id"], r["position"]): r for r in with_scorer}
    rule = rule_of(run, scorer)
    margin = CitationConfig().margin
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


def grade(run: Path, out: Path) -> None:
    rows = rows_of(run)
    text = gzip.decompress(out.read_bytes()).decode() if out.suffix == ".gz" else out.read_text()
    lines = [json.loads(x) for x in text.splitlines()]
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
    else:
        grade(Path(sys.argv[2]), Path(sys.argv[3]))
