"""`midlens eval report`: markdown tables and PNG plots from one or more run directories.

Sweep tables compare methods on the same questions: only examples finished for every method and
position of that dataset count (a run still in progress reports its complete prefix), and `n` says
how many. Runs whose answers were produced under different settings (token budget, paragraph
clipping, evidence configuration, model) are never pooled: each setting gets its own table, labelled
by what differs. Unavailable methods (not built yet) are listed as such.
"""

from __future__ import annotations

import io
import json
import statistics
from collections import defaultdict
from pathlib import Path

from midlens.core.names import METHODS, ORDERINGS
from midlens.eval.metrics import bootstrap_ci
from midlens.eval.runner import CONFIG, RunError, read_rows, write_atomic

RANKERS = ("dense", "bm25", "evidence_raw", "evidence_calibrated")
RANK_METRICS = ("recall@1", "recall@2", "recall@5", "mrr", "ndcg@10")


# Config entries that change a unit's result beyond what its key names (example, method, position).
SETTINGS = ("model", "max_new_tokens", "max_words", "evidence", "logprob", "top_k", "prompt_style", "retrieval")


def load_runs(run_dirs: list[Path]) -> tuple[list[dict], list[dict]]:
    """Configs and rows of the runs; each row gets its run's "setting". A unit present in several runs
    under the same setting (the same work done twice, or shard files next to their merge) counts once."""
    configs, rows = [], {}
    for run in map(Path, run_dirs):
        if not (run / CONFIG).is_file():
            raise RunError(
                f"{run} is not a run directory (no {CONFIG}); pass the --out of `midlens eval sweep|rerank|e2e`."
            )
        config = json.loads((run / CONFIG).read_text())
        configs.append(config)
        setting = {k: config.get(k) for k in SETTINGS}
        setting["prompt_style"] = setting["prompt_style"] or "litm"  # runs from before the option used Liu et al.'s
        if config.get("kind") == "e2e":
            setting["retrieval"] = setting["retrieval"] or "dense"  # e2e runs from before the option were dense
        labels = {m: method_label(m, c) for m, c in config.get("methods", {}).items()}
        for f in sorted(run.glob("results*.jsonl")):
            for row in read_rows(f):
                label = labels.get(row["method"], row["method"])
                key = "|".join(label if part == row["method"] else part for part in row["key"].split("|"))
                row = {**row, "key": key, "method": label, "setting": setting}
                rows[(json.dumps(setting, sort_keys=True), key)] = row
    return configs, list(rows.values())


def method_label(key: str, recorded: dict) -> str:
    """What a run's method is called in tables: the spec of the options it ran with, against today's defaults.

    A run names its methods as they were typed (`attn-calibration`), and a default can change later (strength 1.0
    became 0.5): labelled by the recorded options, two runs of one name under different defaults stay apart and
    an old run reads `attn-calibration(strength=1.0)`. Orderings (lcr, attn-sort) keep their own name.
    """
    if recorded.get("ordering"):
        return key
    from midlens.generators.methods.registry import MethodConfig

    options = {k: v for k, v in recorded.items() if k not in ("name", "ordering")}
    return MethodConfig(recorded.get("name", key), options).spec()


def _grouped(
    rows: list[dict], kind: str, base, shown: tuple[str, ...] = (), family=lambda b: b
) -> dict[tuple, tuple[str, list[dict]]]:
    """Rows of one kind by base(row) and setting -> {(base, setting): (label suffix, rows)}; the suffix
    names each setting that differs between groups of the same family (by default: the same base), so no two
    tables look alike."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] == kind:
            groups[(base(r), json.dumps(r.get("setting", {}), sort_keys=True))].append(r)
    out = {}
    for b, setting in groups:
        siblings = [json.loads(s) for bb, s in groups if family(bb) == family(b)]
        this = json.loads(setting)
        differs = [
            key
            for key in SETTINGS
            if key not in shown and len({json.dumps(s.get(key), sort_keys=True) for s in siblings}) > 1
        ]
        out[(b, setting)] = ("".join(_differing(key, this, siblings) for key in differs), groups[(b, setting)])
    return out


def _differing(key: str, this: dict, siblings: list[dict]) -> str:
    """ ", key=value" for a setting that differs between groups; of a dict (evidence), only the entries that differ,
    so a label stays short enough for a plot title."""
    value = this.get(key)
    if not isinstance(value, dict):
        return f", {key}={value}"
    values = [s.get(key) or {} for s in siblings]
    sub = [k for k in value if len({json.dumps(v.get(k), sort_keys=True) for v in values}) > 1]
    return "".join(f", {key} {k}={value[k]}" for k in sub) or f", {key}={value}"


def _sweep_groups(rows: list[dict]) -> dict[str, list[dict]]:
    groups = _grouped(rows, "sweep", lambda r: (r["dataset"], r["k"]), shown=("max_new_tokens",))
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
        methods = sorted({r["method"] for r in rs}, key=_method_order)
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
                per_pos[p]["em_ci"] = bootstrap_ci([r["em"] for r in sel])
            accs = [per_pos[p]["em"] for p in positions]
            per_example = defaultdict(list)  # the average's interval resamples questions, all positions together
            per_example_logp = defaultdict(list)
            for r in rs:
                if r["method"] == m and r["example_id"] in complete:
                    per_example[r["example_id"]].append(r["em"])
                    if "logprob" in r:
                        per_example_logp[r["example_id"]].append(r["logprob"])
            table[m] = {
                "per_example_em": {e: _mean(v) for e, v in per_example.items()},
                "per_example_logprob": {e: _mean(v) for e, v in per_example_logp.items()},
                "positions": per_pos,
                "avg": _mean(accs),
                "avg_ci": bootstrap_ci([_mean(v) for v in per_example.values()]),
                "gap": max(accs) - min(accs) if accs else float("nan"),
                "recall@2": _mean([per_pos[p]["recall@2"] for p in positions]),
                "seconds": _mean([per_pos[p]["seconds"] for p in positions]),
                "f1": _mean([per_pos[p]["f1"] for p in positions]),
            }
        out[ds] = {
            "n": len(complete),
            "positions": positions,
            "methods": table,
            "paired": paired_differences(table, against),
        }
    return out


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
        for key in ("em", "logprob"):
            b, x = base[f"per_example_{key}"], t[f"per_example_{key}"]
            diffs = [x[e] - b[e] for e in x if e in b]
            row[key] = (_mean(diffs), bootstrap_ci(diffs))
        out[m] = row
    return out


def _method_order(m: str) -> tuple[int, str]:
    """Registered methods in registration order (baseline first), then the orderings, then anything else; a spec
    such as `mudaf(alpha=0)` sorts with its method."""
    order = [*METHODS, *ORDERINGS]
    name = m.split("(", 1)[0].strip()
    return (order.index(name) if name in order else len(order), m)


def rerank_summary(rows: list[dict]) -> dict:
    groups = _grouped(rows, "rerank", lambda r: (r["dataset"], r["method"]))
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


EVIDENCE_RANKERS = ("evidence_raw", "evidence_calibrated")
PAIRED_COLUMNS = (("recall@2", "dense"), ("recall@2", "bm25"), ("recall@2", None), ("mrr", None))  # None: `against`


def rerank_paired(rows: list[dict], against: str = "baseline") -> dict[str, dict]:
    """Each method's evidence ranking minus a reference on the same questions: the dense order and BM25 (same
    prompts), and the evidence of the same kind from method `against`; mean and bootstrap interval per
    PAIRED_COLUMNS entry.

    Questions count only when every method of the dataset and setting ranked them, as in the sweep tables, so a
    run still in progress compares its complete prefix. Pairing is what can tell a few points of recall apart at
    n = 200, where each ranker's own interval is ~+-0.06 wide."""
    out = {}
    for (ds, _), (suffix, rs) in _grouped(rows, "rerank", lambda r: r["dataset"]).items():
        by_method: dict[str, dict[str, dict]] = defaultdict(dict)
        for r in rs:
            by_method[r["method"]][r["example_id"]] = r["rankers"]
        common = sorted(set.intersection(*(set(v) for v in by_method.values())))
        if not common:
            continue
        table = {}
        for m in sorted(by_method, key=_method_order):
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
    groups = _grouped(rows, "e2e", lambda r: (r["dataset"], r["method"]), family=_dataset)
    return {(ds + suffix, m): rs for ((ds, m), _), (suffix, rs) in groups.items()}


def e2e_summary(rows: list[dict]) -> dict:
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
        diffs = {m: [this[e][m] - base[e][m] for e in common] for m in ("em", "f1", "retrieval_recall")}
        out[key] = {"against": ref_key, "n": len(common), **{m: (_mean(d), bootstrap_ci(d)) for m, d in diffs.items()}}
    return out


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}"


def _points_ci(x: float, ci: tuple[float, float]) -> str:
    return f"{100 * x:+.1f} [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]"


def _pct_ci(x: float, ci: tuple[float, float]) -> str:
    """A share in % with its 95 % interval, e.g. `9.5 [5.5, 13.5]`."""
    return _pct(x) if ci[0] != ci[0] else f"{_pct(x)} [{_pct(ci[0])}, {_pct(ci[1])}]"


def markdown(configs: list[dict], rows: list[dict], against: str = "baseline") -> str:
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
                lines.append(
                    f"| {m} | {100 * em:+.1f} [{100 * em_ci[0]:+.1f}, {100 * em_ci[1]:+.1f}] | "
                    f"{lp:+.2f} [{lp_ci[0]:+.2f}, {lp_ci[1]:+.2f}] |"
                )
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
                f"{_pct(s['retrieval_recall'])} | {_pct(s['evidence_recall@2'])} | {s['seconds']:.2f} |"
            )
        paired = e2e_paired(rows)
        for ref in dict.fromkeys(d["against"] for d in paired.values()):
            lines += ["", f"Paired on the same questions, minus **{ref[0]} / {ref[1]}** (points):", ""]
            lines += ["| dataset | method | n | EM | F1 | retrieval recall |", "|" + "---|" * 6]
            for (ds, m), d in paired.items():
                if d["against"] == ref:
                    cells = [_points_ci(*d[k]) for k in ("em", "f1", "retrieval_recall")]
                    lines.append(f"| {ds} | {m} | {d['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buf.getvalue())


def plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sweeps = sweep_summary(rows)
    for metric, label, fname in (
        ("em", "accuracy (%)", "accuracy_vs_position.png"),
        ("gold_rank", "gold evidence rank (1 = top)", "evidence_rank_vs_position.png"),
    ):
        if not sweeps:
            break
        fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 3.6), squeeze=False)
        for ax, (ds, s) in zip(axes[0], sweeps.items(), strict=True):
            for m, t in s["methods"].items():
                ys = [t["positions"][p][metric] * (100 if metric == "em" else 1) for p in s["positions"]]
                line = ax.plot(s["positions"], ys, marker="o", label=m)[0]
                if metric == "em":  # 95 % bootstrap band: differences inside it are noise at this n
                    lo = [100 * t["positions"][p]["em_ci"][0] for p in s["positions"]]
                    hi = [100 * t["positions"][p]["em_ci"][1] for p in s["positions"]]
                    ax.fill_between(s["positions"], lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
            ax.set(title=f"{ds}, n={s['n']}", xlabel="gold position", ylabel=label, xticks=s["positions"])
            if metric == "gold_rank":
                ax.invert_yaxis()
            ax.legend(fontsize=8)
        _save(fig, out / fname)
        plt.close(fig)
        written.append(out / fname)
    reranks = rerank_summary(rows)
    if reranks:
        fig, axes = plt.subplots(1, len(reranks), figsize=(6 * len(reranks), 3.6), squeeze=False)
        for ax, ((ds, method), s) in zip(axes[0], reranks.items(), strict=True):
            ks = ["recall@1", "recall@2", "recall@5"]
            width = 0.8 / len(RANKERS)
            for i, name in enumerate(RANKERS):
                vals = [s["rankers"][name][k] for k in ks]
                err = [
                    [v - s["ci"][name][k][0] for v, k in zip(vals, ks, strict=True)],
                    [s["ci"][name][k][1] - v for v, k in zip(vals, ks, strict=True)],
                ]
                ax.bar([j + i * width for j in range(len(ks))], vals, width, yerr=err, capsize=2, label=name)
            ax.set(title=f"{ds} ({method}), n={s['n']}", ylabel="recall", ylim=(0, 1))
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], ks)
            ax.legend(fontsize=8)
        _save(fig, out / "reranker_recall.png")
        plt.close(fig)
        written.append(out / "reranker_recall.png")
    return written


def write_report(run_dirs: list[Path], out: Path, against: str | None = None) -> Path:
    """report.md and its PNGs in `out`. Paired tables subtract method `against`, named as the tables label it;
    None: the baseline, where the runs have one."""
    configs, rows = load_runs(run_dirs)
    if not rows:
        raise RunError(f"no results yet in {', '.join(map(str, run_dirs))}.")
    methods = sorted({r["method"] for r in rows if r["kind"] in ("sweep", "rerank")}, key=_method_order)
    if against is not None and against not in methods:
        raise RunError(
            f"--against {against!r}: no sweep or rerank rows of that method in these runs; "
            f"choose one of {', '.join(methods) or '(none)'}."
        )
    against = against or "baseline"
    out = Path(out)
    text = markdown(configs, rows, against)
    pngs = plots(rows, out)
    text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    write_atomic(out / "report.md", text)
    return out / "report.md"
