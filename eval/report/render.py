"""report.md's text: the summaries as markdown tables."""

from __future__ import annotations

from midlens.eval.report.summarise import (
    PAIRED_COLUMNS,
    RANK_METRICS,
    e2e_paired,
    e2e_summary,
    rerank_paired,
    rerank_summary,
    sweep_summary,
)

UNGRADED = "n/a (no gold_titles)"
NO_GOLD_NOTE = (
    "Retrieval recall and evidence R@2 are unavailable (n/a) where the questions file gives no `gold_titles`: "
    'they count the gold passages found, so add `"gold_titles": [title, ...]` to each question to measure them.'
)


def _pct(x: float, missing: str = "-") -> str:
    return missing if x != x else f"{100 * x:.1f}"


def _points_ci(x: float, ci: tuple[float, float]) -> str:
    return f"{100 * x:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _pct_ci(x: float, ci: tuple[float, float]) -> str:
    """A share in % with its 95 % interval, e.g. `9.5 [5.5, 13.5]`."""
    return _pct(x) if ci[0] != ci[0] else f"{_pct(x)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def markdown(configs: list[dict], rows: list[dict], against: str = "baseline") -> str:
    """The report's tables: position sweeps, evidence as a reranker, end to end; paired tables subtract `against`."""
    lines = ["# midlens evaluation report", ""]
    models = sorted({c.get("model", "?") for c in configs})
    lines.append(
        f"Model(s): {', '.join(models)}. Accuracy = best_subspan_em on the first output line, in %; "
        "[brackets]: 95 % bootstrap interval over questions."
    )
    for ds, s in sweep_summary(rows, against).items():
        pos = s["positions"]
        lines += ["", f"## Position sweep: {ds}, n = {s['n']} questions complete for every method and position", ""]
        head = ["method"] + [f"gold@{p}" for p in pos] + ["average", "gap", "evidence R@2", "s/example"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m, t in s["methods"].items():
            cells = [_pct_ci(t["positions"][p]["em"], t["positions"][p]["em_ci"]) for p in pos]
            lines.append(
                f"| {m} | " + " | ".join(cells) + f" | {_pct_ci(t['avg'], t['avg_ci'])} | {_pct(t['gap'])} | "
                f"{_pct(t['recall@2'])} | {t['seconds']:.2f} |"
            )
        if s["paired"]:
            lines += ["", f"Paired difference against {against} on the same questions (average over positions):", ""]
            lines += ["| method | accuracy, points | gold-answer log-probability, nats |", "|---|---|---|"]
            for m, d in s["paired"].items():
                (em, em_ci), (lp, lp_ci) = d["em"], d["logprob"]
                lines.append(f"| {m} | {_points_ci(em, em_ci)} | {lp:+.2f} [{lp_ci[0]:+.2f}, {lp_ci[1]:+.2f}] |")
        lines += [
            "",
            "Continuous measures per gold position (answer F1 %, gold-answer log-probability, gold evidence "
            "rank by calibrated evidence, gold share of raw passage attention %):",
            "",
        ]
        head = ["method", "F1"] + [f"logp@{p}" for p in pos] + [f"rank@{p}" for p in pos] + [f"share@{p}" for p in pos]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m, t in s["methods"].items():
            pp = t["positions"]
            cells = (
                [_pct(t["f1"])] + [f"{pp[p]['logprob']:.2f}" for p in pos] + [f"{pp[p]['gold_rank']:.2f}" for p in pos]
            )
            cells += [_pct(pp[p]["gold_share"]) for p in pos]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    for (ds, method), s in rerank_summary(rows).items():
        lines += ["", f"## Evidence as a reranker: {ds}, evidence from {method}, n = {s['n']}", ""]
        lines += ["| ranker | " + " | ".join(RANK_METRICS) + " |", "|" + "---|" * (len(RANK_METRICS) + 1)]
        for name, vals in s["rankers"].items():
            ci = s["ci"][name]
            cells = [f"{vals[m]:.3f} [{ci[m][0]:.3f}, {ci[m][1]:.3f}]" for m in RANK_METRICS]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for ds, s in rerank_paired(rows, against).items():
        lines += ["", f"Evidence minus other rankers on the same {s['n']} questions ({ds}; mean [95 % interval]):", ""]
        head = ["evidence from", "ranker"] + [f"{metric} - {ref or against}" for metric, ref in PAIRED_COLUMNS]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (m, name), cells in s["table"].items():
            shown = [
                f"{cells[c][0]:+.3f} [{cells[c][1][0]:+.3f}, {cells[c][1][1]:+.3f}]" if c in cells else ""
                for c in PAIRED_COLUMNS
            ]
            lines.append(f"| {m} | {name} | " + " | ".join(shown) + " |")
    e2e = e2e_summary(rows)
    if e2e:
        lines += ["", "## End to end (retrieve -> generate)", ""]
        lines += ["| dataset | method | n | EM | F1 | retrieval recall | evidence R@2 | s/example |", "|" + "---|" * 8]
        for (ds, m), s in e2e.items():
            lines.append(
                f"| {ds} | {m} | {s['n']} | {_pct_ci(s['em'], s['em_ci'])} | {_pct(s['f1'])} | "
                f"{_pct(s['retrieval_recall'], UNGRADED)} | {_pct(s['evidence_recall@2'], UNGRADED)} | "
                f"{s['seconds']:.2f} |"
            )
        if any(s["retrieval_recall"] != s["retrieval_recall"] for s in e2e.values()):
            lines += ["", NO_GOLD_NOTE]
        paired = e2e_paired(rows)
        for ref in dict.fromkeys(d["against"] for d in paired.values()):
            lines += ["", f"Paired on the same questions, minus **{ref[0]} / {ref[1]}** (points):", ""]
            lines += ["| dataset | method | n | EM | F1 | retrieval recall |", "|" + "---|" * 6]
            for (ds, m), d in paired.items():
                if d["against"] == ref:
                    cells = [_points_ci(*d[k]) for k in ("em", "f1")]
                    recall = d["retrieval_recall"]
                    cells.append(UNGRADED if recall is None else _points_ci(*recall))
                    lines.append(f"| {ds} | {m} | {d['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
