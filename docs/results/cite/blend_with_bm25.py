"""Would BM25 help the citation rule? A post-hoc check on stored `eval cite` rows (no model needed).

Adds each answer sentence's BM25 share over the passages (the lexical citer's scores, clipped and normalised like the
evidence) as a third term of the library's blend: (1 - w - l) x answer attention share + w x evidence share + l x BM25
share, graded over the report's grid (max_sources x min_share) with l in {0, 0.25, 0.5}. At l = 0 the score is the
library's own (`core.citation_rule.citation_scores`, asserted). The rule is chosen on the train rows; the eval rows
only report what each rule scores.

    python docs/results/cite/blend_with_bm25.py TRAIN_ROWS EVAL_ROWS
"""

from __future__ import annotations

import gzip
import json
import math
import sys

from midlens.core.citation_rule import apply_rule, citation_scores, evidence_shares
from midlens.eval.cite import gold_sets, prf

GRID = [
    (w, lexical, max_sources, min_share)
    for w in (0.0, 0.25, 0.5, 0.75, 1.0)
    for lexical in (0.0, 0.25, 0.5)
    if w + lexical <= 1
    for max_sources in (1, 2, 3)
    for min_share in (0.0, 0.3, 0.5, 0.7, 0.9)
]


def load(path: str) -> list[dict]:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return [r for r in map(json.loads, f) if r.get("kind") == "cite"]


def blended(sentence: dict, evidence: list[float], w: float, lexical: float) -> list[float]:
    k = len(sentence["attention"])
    e = evidence_shares(evidence)
    if e is None:  # no positive evidence: the library scores by attention alone then; so does this blend
        e, w = [0.0] * k, 0.0
    b = evidence_shares(sentence["lexical"]) or [0.0] * k
    scores = [
        (1 - w - lexical) * a + w * ei + lexical * bi for a, ei, bi in zip(sentence["attention"], e, b, strict=True)
    ]
    if lexical == 0:
        library = citation_scores(sentence["attention"], evidence, w)
        assert all(math.isclose(s, t, abs_tol=1e-12) for s, t in zip(scores, library, strict=True))
    return scores


def passage_f1(rows: list[dict], rule: tuple[float, float, int, float]) -> float:
    w, lexical, max_sources, min_share = rule
    total = 0.0
    for row in rows:
        cited = set()
        for sentence in row["sentences"]:
            scores = blended(sentence, row["evidence"], w, lexical)
            cited |= {str(p) for p in apply_rule(scores, max_sources, min_share)}
        total += prf(cited, gold_sets(row)[0])["f1"]
    return 100 * total / len(rows)


def main(train_path: str, eval_path: str) -> None:
    train, held = load(train_path), load(eval_path)
    scored = sorted(((passage_f1(train, r), r) for r in GRID), key=lambda x: -x[0])
    print(f"{len(train)} train rows, {len(held)} eval rows; passage-level F1 %, all answers")
    print("| evidence w | BM25 l | max_sources | min_share | train | eval |\n|---|---|---|---|---|---|")
    best_lexical = next(x for x in scored if x[1][1] > 0)
    for f1, rule in scored[:5] + ([best_lexical] if best_lexical not in scored[:5] else []):
        print("| " + " | ".join(f"{v:g}" for v in rule) + f" | {f1:.1f} | {passage_f1(held, rule):.1f} |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
