"""Tables as numbers: per-method means with bootstrap intervals, and paired differences on the same questions.

Sweep tables compare methods on the same questions: only examples finished for every method and position of
that dataset count (a run still in progress reports its complete prefix), and `n` says how many.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

from midlens.eval.metrics import bootstrap_ci, first_line
from midlens.eval.report.groups import grouped, method_order

RANKERS = ("dense", "bm25", "evidence_raw", "evidence_calibrated")
RANK_METRICS = ("recall@1", "recall@2", "recall@5", "mrr", "ndcg@10")
EVIDENCE_RANKERS = ("evidence_raw", "evidence_calibrated")
PAIRED_COLUMNS = (("recall@2", "dense"), ("recall@2", "bm25"), ("recall@2", None), ("mrr", None))  # None: `against`


def _sweep_groups(rows: list[dict]) -> dict[str, list[dict]]:
    groups = grouped(rows, "sweep", lambda r: (r["dataset"], r["k"]), shown=("max_new_tokens",))
    return {
        f"{ds} (K={k}, {json.loads(setting).get('max_new_tokens')} new tokens{suffix})": rs
        for ((ds, k), setting), (suffix, rs) in groups.items()
    }


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def sweep_summary(rows: list[dict], against: str = "baseline") -> dict:
    """{dataset: {"n", "positions", "methods": {method: {position: {metric: mean}, "avg", "gap", ...}}, "paired"}};
    "paired" holds each method minus `against` on the same questions."""
    out = {}
    for ds, rs in _sweep_groups(rows).items():
        methods = sorted({r["method"] for r in rs}, key=method_order)
        positions = sorted({r["position"] for r in rs})
        cells = {(r["example_id"], r["method"], r["position"]) for r in rs}
        ids = {r["example_id"] for r in rs}
        complete = {e for e in ids if all((e, m, p) in cells for m in methods for p in positions)}
        table = {}
        for m in methods:
            per_pos = {}
            for p in positions:
                sel = [r for r in rs if r["method"] == m and r["position"] == p and r["example_id"] in complete]
                per_pos[p] = {
                    key: _mean([r[key] for r in sel if key in r])
                    for key in ("em", "f1", "logprob", "gold_rank", "gold_share", "seconds")
                }
                per_pos[p]["recall@2"] = _mean([float(r["gold_rank"] <= 2) for r in sel])
                per_pos[p]["words"] = _mean([answer_words(r["prediction"]) for r in sel if "prediction" in r])
                per_pos[p]["f1_ci"] = bootstrap_ci([r["f1"] for r in sel if "f1" in r])
                per_pos[p]["em_ci"] = bootstrap_ci([r["em"] for r in sel])
            accs = [per_pos[p]["em"] for p in positions]
            per_example = defaultdict(list)  # the average's interval resamples questions, all positions together
            per_example_logp = defaultdict(list)
            per_example_f1 = defaultdict(list)
            by_slot = {p: {} for p in positions}  # per gold slot, each question's EM: a slot's paired difference
            for r in rs:
                if r["method"] == m and r["example_id"] in complete:
                    per_example[r["example_id"]].append(r["em"])
                    by_slot[r["position"]][r["example_id"]] = r["em"]
                    if "f1" in r:
                        per_example_f1[r["example_id"]].append(r["f1"])
                    if "logprob" in r:
                        per_example_logp[r["example_id"]].append(r["logprob"])
            table[m] = {
                "per_example_em": {e: _mean(v) for e, v in per_example.items()},
                "per_position_em": by_slot,
                "per_example_f1": {e: _mean(v) for e, v in per_example_f1.items()},
                "per_example_logprob": {e: _mean(v) for e, v in per_example_logp.items()},
                "positions": per_pos,
                "avg": _mean(accs),
                "avg_ci": bootstrap_ci([_mean(v) for v in per_example.values()]),
                "gap": max(accs) - min(accs) if accs else float("nan"),
                "recall@2": _mean([per_pos[p]["recall@2"] for p in positions]),
                "seconds": _mean([per_pos[p]["seconds"] for p in positions]),
                "f1": _mean([per_pos[p]["f1"] for p in positions]),
                "f1_ci": bootstrap_ci([_mean(v) for v in per_example_f1.values()]),
                "words": _mean([per_pos[p]["words"] for p in positions]),
                # The runs that timed these rows (rows copied between runs keep the hash of the run that made them).
                "timed_in": sorted({r.get("config_sha256", "") for r in rs if r["method"] == m}),
            }
        out[ds] = {
            "n": len(complete),
            "positions": positions,
            "methods": table,
            "paired": paired_differences(table, against),
        }
    return out


def answer_words(prediction: str) -> int:
    """Words in the answer the metrics read (its first line): EM credits a long sentence that contains the answer,
    F1 punishes every extra word, so each is read beside the length it was earned at."""
    return len(first_line(prediction).split())


def paired_differences(table: dict, against: str = "baseline") -> dict:
    """Each method minus `against` on the same questions: the mean difference and its bootstrap interval.

    Pairing removes the question-to-question spread that the per-method intervals carry, so a
    difference of a few points can be told from noise at n = 200 when the unpaired intervals overlap.
    """
    if against not in table:
        return {}
    base = table[against]
    out = {}
    for m, t in table.items():
        if m == against:
            continue
        row = {}
        for key in ("em", "f1", "logprob"):
            b, x = base[f"per_example_{key}"], t[f"per_example_{key}"]
            diffs = [x[e] - b[e] for e in x if e in b]
            row[key] = (_mean(diffs), bootstrap_ci(diffs))
        # Per gold slot too: a slot below the reference by a question or two is told from a real loss by its interval.
        row["em_at"] = {}
        for p, x in t.get("per_position_em", {}).items():
            b = base.get("per_position_em", {}).get(p, {})
            diffs = [x[e] - b[e] for e in x if e in b]
            row["em_at"][p] = (_mean(diffs), bootstrap_ci(diffs))
        out[m] = row
    return out


def rerank_summary(rows: list[dict]) -> dict:
    """{(dataset label, method): {"n", "rankers": {ranker: {metric: mean}}, "ci": {ranker: {metric: interval}}}}."""
    groups = grouped(rows, "rerank", lambda r: (r["dataset"], r["method"]))
    by = {(ds + suffix, m): rs for ((ds, m), _), (suffix, rs) in groups.items()}
    return {
        key: {
            "n": len(rs),
            "rankers": {
                name: {m: _mean([r["rankers"][name][m] for r in rs]) for m in RANK_METRICS} for name in RANKERS
            },
            "ci": {
                name: {m: bootstrap_ci([r["rankers"][name][m] for r in rs]) for m in RANK_METRICS} for name in RANKERS
            },
        }
        for key, rs in by.items()
    }


def rerank_paired(rows: list[dict], against: str = "baseline") -> dict[str, dict]:
    """Each method's evidence ranking minus a reference on the same questions: the dense order and BM25 (same
    prompts), and the evidence of the same kind from method `against`; mean and bootstrap interval per
    PAIRED_COLUMNS entry.

    Questions count only when every method of the dataset and setting ranked them, as in the sweep tables, so a
    run still in progress compares its complete prefix. Pairing is what can tell a few points of recall apart at
    n = 200, where each ranker's own interval is ~+-0.06 wide."""
    out = {}
    for (ds, _), (suffix, rs) in grouped(rows, "rerank", lambda r: r["dataset"]).items():
        by_method: dict[str, dict[str, dict]] = defaultdict(dict)
        for r in rs:
            by_method[r["method"]][r["example_id"]] = r["rankers"]
        common = sorted(set.intersection(*(set(v) for v in by_method.values())))
        if not common:
            continue
        table = {}
        for m in sorted(by_method, key=method_order):
            this, base = by_method[m], by_method.get(against)
            for name in EVIDENCE_RANKERS:
                cells = {}
                for metric, ref in PAIRED_COLUMNS:
                    if ref is not None:
                        refs = [this[e][ref][metric] for e in common]
                    elif base is not None and m != against:
                        refs = [base[e][name][metric] for e in common]
                    else:
                        continue
                    diffs = [this[e][name][metric] - r for e, r in zip(common, refs, strict=True)]
                    cells[(metric, ref)] = (_mean(diffs), bootstrap_ci(diffs))
                table[(m, name)] = cells
        out[ds + suffix] = {"n": len(common), "table": table}
    return out


def _dataset(base: tuple[str, str]) -> str:
    # End-to-end rows of one dataset are read as one table: a method run in a single setting still shows the
    # settings (model, top-k, retrieval) that tell it from the rows around it.
    return base[0]


def _e2e_groups(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """End-to-end rows by (dataset label with its differing settings, method), in the order the runs were given."""
    groups = grouped(rows, "e2e", lambda r: (r["dataset"], r["method"]), family=_dataset)
    return {(ds + suffix, m): rs for ((ds, m), _), (suffix, rs) in groups.items()}


def e2e_summary(rows: list[dict]) -> dict:
    """{(dataset label, method): {"n", metric: mean, ..., "em_ci"}} for the end-to-end rows; a metric no row has (the
    recalls without "gold_titles") is NaN."""
    by = _e2e_groups(rows)
    keys = ("em", "f1", "retrieval_recall", "evidence_recall@2", "seconds")
    return {
        k: {
            "n": len(rs),
            **{m: _mean([r[m] for r in rs if m in r]) for m in keys},
            "em_ci": bootstrap_ci([r["em"] for r in rs]),
        }
        for k, rs in by.items()
    }


def e2e_paired(rows: list[dict]) -> dict[tuple[str, str], dict]:
    """Each end-to-end group minus the first group (in the order the runs were given) that answered the same
    questions: EM, F1 and retrieval recall, mean difference and bootstrap interval over questions. Settings such as
    retrieval or top-k are compared this way: at n = 40-60 a 5-point difference hides inside unpaired intervals."""
    runs = [(key, {r["example_id"]: r for r in rs}) for key, rs in _e2e_groups(rows).items()]
    out = {}
    for i, (key, this) in enumerate(runs):
        ref = next(((k, rs) for k, rs in runs[:i] if set(rs) == set(this)), None)
        if ref is None:
            continue
        (ref_key, base), common = ref, sorted(this)
        diffs = {m: [this[e][m] - base[e][m] for e in common] for m in ("em", "f1")}
        # Retrieval recall exists only for questions that name their gold passages ("gold_titles" is optional):
        # paired over those, None when no question does.
        graded = [e for e in common if "retrieval_recall" in this[e] and "retrieval_recall" in base[e]]
        recall = [this[e]["retrieval_recall"] - base[e]["retrieval_recall"] for e in graded]
        out[key] = {
            "against": ref_key,
            "n": len(common),
            **{m: (_mean(d), bootstrap_ci(d)) for m, d in diffs.items()},
            "retrieval_recall": (_mean(recall), bootstrap_ci(recall)) if graded else None,
            "n_retrieval": len(graded),
        }
    return out
