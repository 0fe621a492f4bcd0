"""The `eval cite` section of report.md: citation precision/recall/F1 against HotpotQA's supporting paragraphs and
sentences, per gold position, for midlens's citations and the baselines on the same answers; paired differences;
the top-k log-probability drops; the rule grid; and the cost measurement when the run folder holds cite-cost.json.

Intervals are 95 % percentile bootstraps over units (question x position); paired differences subtract the two
citers' scores on the same unit before resampling. Prompted citations come from their own pass: their "right
answers" are the prompted answers that are right.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from midlens.eval.cite import CITERS, DEFAULT_RULE, DROP_RANKINGS, RULE_FILE, cited_sets, gold_sets, prf
from midlens.eval.metrics import bootstrap_ci, ratio_ci
from midlens.eval.report.groups import method_order

GRID_SOURCES = (1, 2, 3)
GRID_SHARES = (0.0, 0.3, 0.5, 0.7, 0.9)
# The evidence weight of midlens's score (core.citation_rule): 0 is the answer's attention alone, 1 the prompt's
# calibrated evidence alone for the passage choice. Lexical scores have no evidence to blend: weight 0 only.
GRID_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
COST_FILE = "cite-cost.json"


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _ci(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = bootstrap_ci(values)
    return f"{100 * _mean(values):.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def _points(values: list[float]) -> str:
    if not values:
        return "-"
    lo, hi = bootstrap_ci(values)
    return f"{100 * _mean(values):+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def _right(row: dict, citer: str) -> bool:
    return (row["prompted"]["em"] if citer == "prompted" else row["em"]) > 0


def unit_scores(row: dict, citer: str, rule: dict) -> dict[str, dict[str, float]] | None:
    """{"passage": prf, "sentence": prf or absent} of one unit's citations by `citer` (None: the citer did not run)."""
    if citer == "prompted" and "prompted" not in row:
        return None
    if citer == "evidence_raw" and "evidence_raw" not in row:
        return None  # a run from before rows kept raw evidence
    if citer == "evidence_from" and "evidence_from" not in row:
        return None  # a run without --cite-evidence
    weight = rule.get("evidence_weight", 0.0)  # a rule.json from before the weight: the answer's attention alone
    raw = rule.get("raw_evidence_weight", 0.0)
    passages, sentences = cited_sets(row, citer, rule["max_sources"], rule["min_share"], weight, raw)
    gold_passages, gold_sentences = gold_sets(row)
    out = {"passage": prf(passages, gold_passages)}
    if sentences is not None:
        out["sentence"] = prf(sentences, gold_sentences)
    return out


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r.get("kind") == "cite":
            setting = r.get("setting", {})
            groups[(r["dataset"], setting.get("model"), r["method"], setting.get("max_words"))].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", method_order(kv[0][2]))))


def _citation_table(rs: list[dict], rule: dict, level: str, right: bool, positions: list[int]) -> list[str]:
    head = ["citer"] + [f"F1 gold@{p}" for p in positions] + ["F1 all positions", "precision", "recall", "n"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for citer in CITERS:
        scored = []
        for r in rs:
            s = unit_scores(r, citer, rule)
            if s is None or level not in s or (right and not _right(r, citer)):
                continue
            scored.append((r["position"], s[level]))
        if not scored:
            continue
        by_pos = [_ci([x["f1"] for p, x in scored if p == q]) for q in positions]
        cells = [
            *by_pos,
            _ci([x["f1"] for _, x in scored]),
            f"{100 * _mean([x['precision'] for _, x in scored]):.1f}",
            f"{100 * _mean([x['recall'] for _, x in scored]):.1f}",
            str(len(scored)),
        ]
        lines.append(f"| {citer} | " + " | ".join(cells) + " |")
    return lines


def _paired_table(rs: list[dict], rule: dict, positions: list[int]) -> list[str]:
    head = ["midlens minus"] + [f"gold@{p}" for p in positions] + ["all positions"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for other in CITERS[1:]:
        diffs = []
        for r in rs:
            mine, theirs = unit_scores(r, "midlens", rule), unit_scores(r, other, rule)
            if theirs is not None:
                diffs.append((r["position"], mine["passage"]["f1"] - theirs["passage"]["f1"]))
        if diffs:
            cells = [_points([d for p, d in diffs if p == q]) for q in positions] + [_points([d for _, d in diffs])]
            lines.append(f"| {other} | " + " | ".join(cells) + " |")
    return lines


def _drop_table(rs: list[dict]) -> list[str]:
    rows = [r for r in rs if "drops" in r]
    if not rows:
        return []
    ks = sorted({k for r in rows for d in r["drops"].values() for k in d}, key=int)
    head = ["ranking"] + [f"top-{k} drop, nats" for k in ks] + [f"top-{k} / contextcite" for k in ks]
    lines = [
        "",
        f"Log-probability drop of the same answer tokens with each ranking's top-k passages removed "
        f"(n = {len(rows)} answers; larger = the ranking found what the answer rests on):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name in DROP_RANKINGS:
        have = [r for r in rows if name in r["drops"]]
        if not have:
            continue
        cells = []
        for k in ks:
            drops = [r["drops"][name][k] for r in have]
            lo, hi = bootstrap_ci(drops)
            cells.append(f"{_mean(drops):.2f} [{lo:.2f}, {hi:.2f}]")
        # On the answers that have both, resampled together: the ratio's interval, not two intervals'.
        both = [r for r in have if "contextcite" in r["drops"]]
        for k in ks:
            mine = [r["drops"][name][k] for r in both]
            reference = [r["drops"]["contextcite"][k] for r in both]
            if not both or not _usable(_mean(reference)):
                cells.append("-")
                continue
            ratio = _mean(mine) / _mean(reference)
            lo, hi = ratio_ci(mine, reference) if name != "contextcite" else (1.0, 1.0)
            cells.append(f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]" if lo == lo else f"{ratio:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _usable(x: float) -> bool:
    return x == x and x != 0


def rule_grid(
    rs: list[dict], citer: str = "midlens", raw_evidence_weight: float = 0.0
) -> dict[tuple[float, int, float], float]:
    """Mean passage-level F1 (all answers) of `citer` under every rule of the grid, keyed (evidence_weight,
    max_sources, min_share), `raw_evidence_weight` of raw evidence blended in beside (weights summing to 1 at most)."""
    weights = [w for w in GRID_WEIGHTS if w + raw_evidence_weight <= 1] if citer == "midlens" else (0.0,)
    return {
        (w, m, s): _mean(
            [
                unit_scores(
                    r,
                    citer,
                    {
                        "max_sources": m,
                        "min_share": s,
                        "evidence_weight": w,
                        "raw_evidence_weight": raw_evidence_weight,
                    },
                )["passage"]["f1"]
                for r in rs
            ]
        )
        for w in weights
        for m in GRID_SOURCES
        for s in GRID_SHARES
    }


def best_rule(grid: dict[tuple[float, int, float], float]) -> tuple[float, int, float]:
    """The grid's best rule; ties go to the fewest sources, then the higher share, then the lower evidence weight
    (the simpler citation, and the one that reads most from the answer itself)."""
    return max(grid, key=lambda key: (grid[key], -key[1], key[2], -key[0]))


def has_raw_evidence(rs: list[dict]) -> bool:
    """Whether every row keeps raw evidence too (runs from 2026-11-27 on), so raw-evidence rules can be graded."""
    return bool(rs) and all("evidence_raw" in r for r in rs)


def _grid_table(rs: list[dict]) -> list[str]:
    lines = []
    raws = GRID_WEIGHTS if has_raw_evidence(rs) else (0.0,)
    for citer, raw in [("midlens", r) for r in raws] + [("lexical", 0.0)]:
        grid = rule_grid(rs, citer, raw)
        best = best_rule(grid)
        weights = sorted({key[0] for key in grid})
        label = f"{citer}, raw_evidence_weight={raw}" if citer == "midlens" and len(raws) > 1 else citer
        lines += [
            "",
            f"Rule grid, {label}: passage-level F1 % (all answers) by evidence_weight and max_sources (rows) and "
            f"min_share (columns); best: evidence_weight={best[0]}, max_sources={best[1]}, min_share={best[2]}:",
            "",
            "| evidence_weight | max_sources | " + " | ".join(f"{s}" for s in GRID_SHARES) + " |",
            "|" + "---|" * (len(GRID_SHARES) + 2),
        ]
        for w in weights:
            for m in GRID_SOURCES:
                cells = " | ".join(f"{100 * grid[(w, m, s)]:.1f}" for s in GRID_SHARES)
                lines.append(f"| {w} | {m} | {cells} |")
    return lines


def _cost_lines(run_dirs: Sequence[Path]) -> list[str]:
    lines = []
    for run in run_dirs:
        path = Path(run) / COST_FILE
        if not path.is_file():
            continue
        c = json.loads(path.read_text())
        lines += [
            "",
            f"## Citation cost: {c['model']}, {c['n']} prompts x {c['repeats']} alternating repeats, "
            f"{c['threads']} thread(s)",
            "",
            "| measure | value |",
            "|---|---|",
            f"| generation without citations, s/answer | {c['generate_plain_s']:.2f} |",
            f"| generation with citations, s/answer | {c['generate_cite_s']:.2f} |",
            f"| with / without, wall time | {c['ratio']:.3f}x |",
            f"| generation without / with citations, CPU s/answer | {c['generate_plain_cpu_s']:.2f} / "
            f"{c['generate_cite_cpu_s']:.2f} |",
            f"| with / without, CPU time | {c['cpu_ratio']:.3f}x |",
            f"| verification / generation, wall time / CPU time | {c['verify_multiple']:.2f}x / "
            f"{c['verify_cpu_multiple']:.2f}x |",
            f"| peak RSS after generation, without / with citations, MB | {c['peak_rss_generate_mb']['plain']:.0f} / "
            f"{c['peak_rss_generate_mb']['cite']:.0f} |",
            f"| peak RSS with citations after verification, MB | {c['peak_rss_mb']['cite']:.0f} |",
        ]
    return lines


def cite_markdown(configs: list[dict], rows: list[dict], run_dirs: Sequence[Path] = ()) -> str:
    """The cite section of report.md ("" when no run holds cite rows)."""
    groups = _groups(rows)
    lines: list[str] = []
    rules, evidence_from = {}, {}
    for config, run in zip(configs, run_dirs, strict=False):
        path = Path(run) / RULE_FILE
        if config.get("kind") == "cite" and path.is_file():
            rules[config.get("dataset")] = json.loads(path.read_text())
        if config.get("kind") == "cite" and "cite_evidence" in config:
            evidence_from[config.get("dataset")] = config["cite_evidence"]["spec"]
    for (ds, model, method, max_words), rs in groups.items():
        rule = rules.get(ds) or DEFAULT_RULE
        positions = sorted({r["position"] for r in rs})
        questions = len({r["example_id"] for r in rs})
        right = sum(r["em"] > 0 for r in rs)
        lines += [
            "",
            f"## Citations: {ds}, {model}, answers by {method}, max_words={max_words}; {questions} questions x "
            f"{len(positions)} positions = {len(rs)} answers ({right} right)",
            "",
            f"Rule: max_sources={rule['max_sources']}, min_share={rule['min_share']}, "
            f"evidence_weight={rule.get('evidence_weight', 0.0)}, "
            f"raw_evidence_weight={rule.get('raw_evidence_weight', 0.0)} (midlens only"
            + (f"; the evidence blended in is {evidence_from[ds]}'s" if ds in evidence_from else "")
            + "). F1 % [95 % interval].",
        ]
        for level in ("passage", "sentence"):
            for right_only in (False, True):
                which = "right answers" if right_only else "all answers"
                lines += ["", f"{level.capitalize()}-level citations, {which}:", ""]
                lines += _citation_table(rs, rule, level, right_only, positions)
        lines += ["", "Paired passage-level F1 difference, points, on the same units (all answers):", ""]
        lines += _paired_table(rs, rule, positions)
        lines += _drop_table(rs)
        lines += _grid_table(rs)
    lines += _cost_lines(run_dirs)
    return "\n".join(lines) + ("\n" if lines else "")
