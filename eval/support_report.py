"""How well support scores separate right answers from wrong ones, on held-out `eval support` runs.

For each held-out run (one model, one answering method, one corpus) and each scorer: the shipped support model of
that model (plain, and verified: reading the ablation drops), the model-agnostic one, the same model fitted on the
default method's train answers alone (what shipped before other methods' answers were in the train rows), and the
simplest baseline, the answer's mean token log-probability alone (a one-feature logistic fit on the same train runs,
so its calibration is comparable):
  AUROC for correctness (EM; and F1 >= 0.5), 95 % bootstrap intervals over answers, paired against the baseline;
  ECE (10 equal-width bins) against EM, and a reliability diagram (PNG);
  selective answering: accuracy of the answers ranked most supported at 25 / 50 / 75 % coverage against all of them,
  and the risk-coverage curve (PNG);
  the threshold's precision and coverage (the answers it calls "likely supported").
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from midlens.eval.support import read_run
from midlens.generators.answering.support import GENERIC, SupportModel, shipped_support_folder, support_method

COVERAGES = (0.25, 0.5, 0.75)
BOOTSTRAP = 1000
BINS = 10


def auroc(scores: list[float], labels: list[int]) -> float | None:
    """The Mann-Whitney form of scikit-learn's roc_auc_score (ties as half; the same number), ~20x faster: the
    bootstrap calls it thousands of times per run and scorer."""
    import numpy as np
    from scipy.stats import rankdata

    y = np.asarray(labels, dtype=bool)
    right = int(y.sum())
    if right in (0, len(y)):
        return None
    ranks = rankdata(scores)  # average ranks over ties
    return float((ranks[y].sum() - right * (right + 1) / 2) / (right * (len(y) - right)))


def auroc_interval(
    scores: list[float], labels: list[int], against: list[float] | None = None, seed: int = 0
) -> tuple[float, float] | None:
    """95 % bootstrap interval over answers of the AUROC, or of its difference from `against`'s on the same draws."""
    rng = random.Random(seed)
    n, values = len(labels), []
    for _ in range(BOOTSTRAP):
        idx = [rng.randrange(n) for _ in range(n)]
        ys = [labels[i] for i in idx]
        a = auroc([scores[i] for i in idx], ys)
        if a is None:
            continue
        if against is not None:
            a -= auroc([against[i] for i in idx], ys)
        values.append(a)
    if not values:
        return None
    values.sort()
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def ece(probabilities: list[float], labels: list[int]) -> float:
    total, n = 0.0, len(labels)
    for b in range(BINS):
        lo, hi = b / BINS, (b + 1) / BINS
        idx = [i for i, p in enumerate(probabilities) if lo <= p < hi or (b == BINS - 1 and p == 1.0)]
        if idx:
            confidence = sum(probabilities[i] for i in idx) / len(idx)
            accuracy = sum(labels[i] for i in idx) / len(idx)
            total += len(idx) / n * abs(confidence - accuracy)
    return total


def selective(probabilities: list[float], labels: list[int]) -> dict[str, float]:
    _, accuracy = risk_coverage(probabilities, labels)
    out = {"all": accuracy[-1]}
    for c in COVERAGES:
        out[f"{int(c * 100)}%"] = accuracy[max(1, round(c * len(accuracy))) - 1]
    return out


def risk_coverage(probabilities: list[float], labels: list[int]) -> tuple[list[float], list[float]]:
    order = sorted(range(len(labels)), key=lambda i: -probabilities[i])
    coverage, accuracy, right = [], [], 0
    for k, i in enumerate(order, start=1):
        right += labels[i]
        coverage.append(k / len(order))
        accuracy.append(right / k)
    return coverage, accuracy


def _shipped(name: str, sha: str, verified: bool) -> SupportModel | None:
    folder = shipped_support_folder(name, verified)
    return SupportModel.load(folder, support_method(verified), sha)[0] if folder.is_dir() else None


DEFAULT_ONLY = "support, default method's answers only"


def scorers(config: dict, train_rows: list[dict]) -> dict[str, SupportModel]:
    """Every scorer of one model's answers: the log-probability baseline (fitted on its train rows), the support model
    fitted on its default method's train rows alone (where other methods' rows are there too), and the shipped
    support models, its own and the model-agnostic ones."""
    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.packaged_models import default_method

    model, sha = config["model"], config["model_sha256"]
    out = {}
    if train_rows:
        out["mean log-prob alone"] = SupportModel.fit(train_rows, False, model, only=("mean_logprob",))
        default = method_config(default_method(model)).spec()
        own = [r for r in train_rows if r["method"] == default]
        if own and len(own) < len(train_rows):
            out[DEFAULT_ONLY] = SupportModel.fit(own, False, model)
    for label, support in (
        ("support", _shipped(model, sha, False)),
        ("support + verification", _shipped(model, sha, True)),
        ("model-agnostic support", _shipped(GENERIC, GENERIC, False)),
        ("model-agnostic + verification", _shipped(GENERIC, GENERIC, True)),
    ):
        if support is not None:
            out[label] = support
    return out


def readable(models: dict[str, SupportModel], verified: bool) -> dict[str, SupportModel]:
    """The scorers a run's rows can feed: a run without verification has no ablation drops for the verified ones."""
    return {label: m for label, m in models.items() if verified or not m.verified}


def measure(rows: list[dict], models: dict[str, SupportModel]) -> dict:
    em = [int(r["em"] >= 0.5) for r in rows]
    f1 = [int(r["f1"] >= 0.5) for r in rows]
    probabilities = {label: [m.probability_of(r["inputs"], r["method"]) for r in rows] for label, m in models.items()}
    baseline = probabilities.get("mean log-prob alone")
    out = {"answers": len(rows), "em": sum(em) / len(em), "f1>=0.5": sum(f1) / len(f1), "scorers": {}}
    for label, ps in probabilities.items():
        model = models[label]
        kept = [i for i, p in enumerate(ps) if p >= model.threshold]
        entry = {
            "fitted_on_method": all(r["method"] in model.methods for r in rows),
            "mean_probability": sum(ps) / len(ps),
            "auroc_em": auroc(ps, em),
            "auroc_em_ci": auroc_interval(ps, em),
            "auroc_f1": auroc(ps, f1),
            "ece": ece(ps, em),
            "selective": selective(ps, em),
            "threshold": model.threshold,
            "coverage_at_threshold": len(kept) / len(ps),
            "precision_at_threshold": sum(em[i] for i in kept) / len(kept) if kept else None,
        }
        if baseline is not None and label != "mean log-prob alone":
            entry["auroc_em_minus_baseline"] = entry["auroc_em"] - auroc(baseline, em)
            entry["auroc_em_minus_baseline_ci"] = auroc_interval(ps, em, against=baseline)
        out["scorers"][label] = entry
    out["probabilities"] = probabilities
    out["labels"] = em
    return out


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _paired(entry: dict) -> str:
    if "auroc_em_minus_baseline" not in entry:
        return "-"
    return f"{entry['auroc_em_minus_baseline']:+.2f}{_ci(entry['auroc_em_minus_baseline_ci'])}"


def _ci(interval) -> str:
    return "" if interval is None else f" [{interval[0]:+.2f}, {interval[1]:+.2f}]"


def _interval(interval) -> str:
    return "" if interval is None else f" [{interval[0]:.2f}, {interval[1]:.2f}]"


POOLED = "hotpotqa+squad"  # the corpora every method was measured on, pooled: one row per method to compare


def write_report(runs: list[Path], out: Path, train: list[Path]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.packaged_models import default_method

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_rows: dict[str, list[dict]] = {}
    for folder in train:
        config, rows = read_run(folder)
        train_rows.setdefault(config["model"], []).extend(rows)
    # {model: {method: {corpus: measure}}}
    results: dict[str, dict[str, dict[str, dict]]] = {}
    by_model: dict[str, dict[str, SupportModel]] = {}  # each model's scorers, fitted and loaded once
    pooled: dict[tuple[str, str], dict[str, list[dict]]] = {}
    for folder in runs:
        config, rows = read_run(folder)
        model, method = config["model"], rows[0]["method"] if rows else "?"
        if model not in by_model:
            by_model[model] = scorers(config, train_rows.get(model, []))
        models = readable(by_model[model], config.get("verify", True))
        results.setdefault(model, {}).setdefault(method, {})[config["dataset"]] = measure(rows, models)
        pooled.setdefault((model, method), {})[config["dataset"]] = rows
    for (model, method), by_dataset in pooled.items():
        plain = readable(by_model[model], False)
        if {"hotpotqa", "squad"} <= set(by_dataset):
            results[model][method][POOLED] = measure(by_dataset["hotpotqa"] + by_dataset["squad"], plain)
        if len(by_dataset) > 2:  # every held-out answer of the model and method at once, by the plain scorers
            results[model][method]["all held-out"] = measure([r for rs in by_dataset.values() for r in rs], plain)

    lines = [
        "# Support scores on held-out answers",
        "",
        "Each row: one model's answers with one answering method (10 passages, gold at 1 / 5 / 10) on one held-out",
        "corpus.",
        "AUROC against EM with a 95 % bootstrap interval over answers; `vs log-prob`: the paired AUROC difference",
        "against the mean token log-probability alone; accuracy (EM %) of the most supported 25 / 50 / 75 % of",
        "answers against all; ECE against EM; the threshold's coverage and precision on these answers.",
        "",
        "## Per method: the shipped support model",
        "",
        "`fitted on it`: whether the support model's train rows held this method's answers (else its words say it is",
        f"not calibrated for it). `{DEFAULT_ONLY}`: the same estimator fitted on the default method's train answers",
        "alone, for comparison.",
        "",
        "| model | method | corpus | answers | EM % | scorer | fitted on it | mean support | AUROC (EM) | ECE |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, by_method in results.items():
        for method, by_dataset in by_method.items():
            for dataset, m in by_dataset.items():
                for label in ("support", DEFAULT_ONLY):
                    s = m["scorers"].get(label)
                    if s is None:
                        continue
                    lines.append(
                        f"| {model} | {method} | {dataset} | {m['answers']} | {100 * m['em']:.1f} | {label} | "
                        f"{'yes' if s['fitted_on_method'] else 'no'} | {s['mean_probability']:.2f} | "
                        f"{_fmt(s['auroc_em'])}{_interval(s['auroc_em_ci'])} | {_fmt(s['ece'], 3)} |"
                    )
    lines.append("")
    for model, by_method in results.items():
        for method, by_dataset in by_method.items():
            lines += [f"## {model}, {method}", ""]
            lines += [
                "| corpus | answers | EM % | scorer | AUROC (EM) | vs log-prob | AUROC (F1>=0.5) | ECE "
                "| acc@25/50/75 % | threshold: coverage / precision |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for dataset, m in by_dataset.items():
                for label, s in m["scorers"].items():
                    sel = s["selective"]
                    lines.append(
                        f"| {dataset} | {m['answers']} | {100 * m['em']:.1f} | {label} | {_fmt(s['auroc_em'])}"
                        f"{_interval(s['auroc_em_ci'])} | {_paired(s)} | "
                        f"{_fmt(s['auroc_f1'])} | {_fmt(s['ece'], 3)} | {100 * sel['25%']:.0f} / "
                        f"{100 * sel['50%']:.0f} / {100 * sel['75%']:.0f} | {100 * s['coverage_at_threshold']:.0f} % / "
                        f"{_percent(s['precision_at_threshold'])} |"
                    )
            lines.append("")
        # The plots show the default method's answers per corpus (what the README's figures always showed).
        default = method_config(default_method(model)).spec()
        _plots(plt, out, model, by_method.get(default) or next(iter(by_method.values())))
        lines += [f"![reliability]({model}-reliability.png) ![risk-coverage]({model}-risk-coverage.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    slim = {
        model: {
            method: {d: {k: v for k, v in m.items() if k not in ("probabilities", "labels")} for d, m in by.items()}
            for method, by in by_method.items()
        }
        for model, by_method in results.items()
    }
    (out / "report.json").write_text(json.dumps(slim, indent=2) + "\n")
    return path


def _plots(plt, out: Path, model: str, by_dataset: dict[str, dict]) -> None:
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for dataset, m in by_dataset.items():
        ps, ys = m["probabilities"].get("support"), m["labels"]
        if ps is None:
            continue
        xs, accs = [], []
        for b in range(BINS):
            idx = [i for i, p in enumerate(ps) if b / BINS <= p < (b + 1) / BINS]
            if len(idx) >= 5:  # a bin of fewer answers says nothing
                xs.append(sum(ps[i] for i in idx) / len(idx))
                accs.append(sum(ys[i] for i in idx) / len(idx))
        ax.plot(xs, accs, marker="o", label=dataset)
    ax.set_xlabel("support (predicted probability right)")
    ax.set_ylabel("share right (EM)")
    ax.set_title(f"{model}: reliability of the support score")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / f"{model}-reliability.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for n, (dataset, m) in enumerate(by_dataset.items()):
        color = f"C{n}"
        for label, style in (("support", "-"), ("mean log-prob alone", "--")):
            ps = m["probabilities"].get(label)
            if ps is not None:
                xs, accs = risk_coverage(ps, m["labels"])
                ax.plot(xs, accs, linestyle=style, color=color, label=f"{dataset}: {label}")
    ax.set_xlabel("coverage (answers kept, most supported first)")
    ax.set_ylabel("accuracy of the answers kept (EM)")
    ax.set_title(f"{model}: selective answering")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / f"{model}-risk-coverage.png", dpi=110)
    plt.close(fig)
