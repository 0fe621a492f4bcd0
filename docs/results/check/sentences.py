"""Checking sentence answers other models wrote (docs/results/check/README.md, "Sentence answers"), from stored rows.

    python docs/results/check/sentences.py            # -> sentences-report.md / .json

Reads docs/results/check/runs-base/<reader>/: the train rows (`*-train`, read by the base model) for the feature
study, and the held-out runs of other models' sweep answers (`<corpus>-by-<writer>`) under the shipped checked
support model (generators/trained/support-checked/<reader>/, fitted on those train rows by `support.py fit`).

- Feature study: grouped 5-fold cross-validation on the train rows (folds by question, so no question's answers sit
  on both sides), answer-level AUROC of the weakest sentence's probability, for the feature sets below, overall and
  by answer style; the verified set on rows checked with --verify only.
- Held out, per reader, corpus, writer and answer style (short: at most 4 words; sentence: more): AUROC against the
  sweep's substring EM with a 95 % percentile bootstrap over answers (1000 resamples, seed 0), the lowest token
  log-probability alone beside it, ECE (10 equal-width bins), the share called likely and how many of those are right.
- False sentences, held out (`<corpus>-false-sentence`): a right answer with one false sentence, copied from the gold
  passage with one entity swapped (`planted`) or of no passage's wording (`added`, beside a paraphrased right
  sentence): how often the lowest-scored sentence is the false one, and the sentence-level AUROC.
- Reader choice: on the same held-out answers read by the base model and by the fine-tune (`*-finetuned-reader`),
  the AUROC of the label-free signals (the weakest sentence's mean and lowest token log-probability).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs-base"
SHORT_WORDS = 4  # an answer of at most this many words is "short" (an entity), longer a "sentence"
BINS = 10
FOLDS = 5

sys.path.insert(0, str(HERE))
from report import _fmt, _interval, _planted  # noqa: E402  (docs/results/check/report.py: AUROC, bootstrap)


def feature_sets() -> dict[str, tuple[str, ...]]:
    from midlens.generators.answering.check import CHECKED_FEATURES, VERIFY_FEATURES

    new = ("new_words_in_passages", "new_words_in_cited_passage")
    previous = tuple(f for f in CHECKED_FEATURES if f not in new)
    return {
        "log-probs only": ("mean_logprob", "min_logprob", "first_logprob", "log_tokens", "mean_margin"),
        "previous (11)": previous,
        "+ new words in passages (shipped)": CHECKED_FEATURES,
        # The ablation's features are read on the rows checked with --verify only: the shipped set on those same
        # rows is the comparison.
        "shipped, on the verified rows": CHECKED_FEATURES,
        "+ verification, on the verified rows": CHECKED_FEATURES + VERIFY_FEATURES,
    }


def style(answer: str) -> str:
    return "short" if len(answer.split()) <= SHORT_WORDS else "sentence"


def weakest(model, row: dict) -> float:
    return min(model.sentence_probabilities(row["inputs"]))


def ece(probabilities: list[float], labels: list[int]) -> float:
    p, y = np.asarray(probabilities), np.asarray(labels)
    bins = np.minimum((p * BINS).astype(int), BINS - 1)
    return float(
        sum(abs(p[bins == b].mean() - y[bins == b].mean()) * (bins == b).sum() for b in set(bins.tolist())) / len(p)
    )


def _min_logprob(row: dict) -> float:
    """The weakest sentence's lowest token log-probability: the label-free signal a checker without a model reads."""
    inputs = row["inputs"]
    lows = [min(inputs["token_logprobs"][a:b], default=-20.0) for a, b in inputs["sentence_tokens"]]
    return min(lows) if lows else -20.0


def _mean_logprob(row: dict) -> float:
    inputs = row["inputs"]
    means = [float(np.mean(inputs["token_logprobs"][a:b])) if b > a else -20.0 for a, b in inputs["sentence_tokens"]]
    return min(means) if means else -20.0


def cross_validated(rows: list[dict], features: tuple[str, ...], reader: str) -> list[float]:
    """Each row's weakest-sentence probability from a model fitted on the other folds (grouped by question)."""
    from sklearn.model_selection import GroupKFold

    from midlens.generators.answering.check import CheckedSupportModel

    groups = [f"{r['dataset']}|{r['example_id']}" for r in rows]
    out = [0.0] * len(rows)
    for train, test in GroupKFold(n_splits=FOLDS).split(rows, groups=groups):
        model = CheckedSupportModel.fit_checked([rows[i] for i in train], reader, features=features)
        for i in test:
            out[i] = weakest(model, rows[i])
    return out


def feature_study(reader: str, rows: list[dict], results: dict) -> list[str]:
    lines = [
        f"### {reader}: grouped {FOLDS}-fold cross-validation on train rows (answer-level AUROC, weakest sentence)",
        "",
        "| features | rows | all | short answers | sentence answers |",
        "|---|---|---|---|---|",
    ]
    verified = [r for r in rows if any(s.get("drop") is not None for s in r["inputs"]["sources"])]
    for name, features in feature_sets().items():
        use = verified if "verified rows" in name else rows
        if len(use) < 2 * FOLDS:
            lines.append(f"| {name} | {len(use)} | not enough verified rows | | |")
            continue
        scores = cross_validated(use, features, reader)
        cells = {}
        for part in ("all", "short", "sentence"):
            idx = [i for i, r in enumerate(use) if part == "all" or style(r["answer"]) == part]
            labels = [int(use[i]["em"] >= 0.5) for i in idx]
            cells[part] = _interval([[(scores[i], y)] for i, y in zip(idx, labels, strict=True)])
        results.setdefault(reader, {}).setdefault("feature_study", {})[name] = {"rows": len(use), **cells}
        lines.append(
            f"| {name} | {len(use)} | {_fmt(cells['all'])} | {_fmt(cells['short'])} | {_fmt(cells['sentence'])} |"
        )
    if verified and len(verified) < len(rows):
        lines += ["", f"Verified rows: {len(verified)} of {len(rows)} (the runs checked with --verify)."]
    return lines


def held_out(reader: str, model, runs: list[Path], results: dict) -> list[str]:
    from midlens.eval.check_support import read_check_run

    lines = [
        f"### {reader} reading other models' answers (threshold {model.threshold:.3f})",
        "",
        "| corpus | written by | style | answers | right % | AUROC [95 %] | lowest log-prob alone | ECE "
        "| likely: share, right % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        config, rows = read_check_run(run)
        rows = [r for r in rows if r["kind"] == "sweep" and r["sentence_labels"]]
        if not rows:
            continue
        writer = rows[0]["source"].split(":")[0]
        corpus = rows[0]["dataset"]
        for part in ("all", "short", "sentence"):
            mine = [r for r in rows if part == "all" or style(r["answer"]) == part]
            if not mine:
                continue
            p = [weakest(model, r) for r in mine]
            y = [int(r["em"] >= 0.5) for r in mine]
            low = [_min_logprob(r) for r in mine]
            auroc = _interval([[(a, b)] for a, b in zip(p, y, strict=True)])
            base = _interval([[(a, b)] for a, b in zip(low, y, strict=True)])
            likely = [b for a, b in zip(p, y, strict=True) if a >= max(model.threshold, 0.5)]
            numbers = {
                "answers": len(y),
                "right": sum(y),
                "auroc": auroc,
                "min_logprob_auroc": base,
                "ece": ece(p, y),
                "likely": len(likely),
                "likely_right": sum(likely),
            }
            results.setdefault(reader, {}).setdefault("held_out", {}).setdefault(f"{corpus}|{writer}", {})[part] = (
                numbers
            )
            right = f"{100 * sum(likely) / len(likely):.0f}" if likely else "-"
            lines.append(
                f"| {corpus} | {writer} | {part} | {len(y)} | {100 * sum(y) / len(y):.1f} | {_fmt(auroc)} "
                f"| {_fmt(base)} | "
                f"{numbers['ece']:.3f} | {100 * len(likely) / len(y):.0f} %, {right} |"
            )
    return lines


def reader_choice(reader: str, runs: list[Path], results: dict) -> list[str]:
    from midlens.eval.check_support import read_check_run

    pairs = [
        (r, r.with_name(r.name + "-finetuned-reader"))
        for r in runs
        if r.with_name(r.name + "-finetuned-reader").is_dir()
    ]
    if not pairs:
        return []
    lines = [
        f"### {reader}: the same answers read by the base model and by the fine-tune (label-free signals, AUROC)",
        "",
        "| corpus | written by | answers | base: weakest mean log-prob | fine-tune | base: lowest log-prob "
        "| fine-tune |",
        "|---|---|---|---|---|---|---|",
    ]
    for base_run, tuned_run in pairs:
        base_rows = {r["key"]: r for r in read_check_run(base_run)[1] if r["sentence_labels"]}
        tuned_rows = {r["key"]: r for r in read_check_run(tuned_run)[1] if r["sentence_labels"]}
        keys = sorted(set(base_rows) & set(tuned_rows))
        y = [int(base_rows[k]["em"] >= 0.5) for k in keys]
        cells = []
        for signal in (_mean_logprob, _min_logprob):
            for rows in (base_rows, tuned_rows):
                cells.append(_interval([[(signal(rows[k]), t)] for k, t in zip(keys, y, strict=True)]))
        first = base_rows[keys[0]]
        results.setdefault(reader, {}).setdefault("reader_choice", {})[base_run.name] = {
            "answers": len(keys),
            "aurocs": cells,
        }
        lines.append(
            f"| {first['dataset']} | {first['source'].split(':')[0]} | {len(keys)} | "
            + " | ".join(_fmt(c) for c in cells)
            + " |"
        )
    return lines


def false_sentences(reader: str, model, runs: list[Path], results: dict) -> list[str]:
    from midlens.eval.check_support import read_check_run

    rows = [r for run in runs for r in read_check_run(run)[1] if r["kind"] in ("planted", "added")]
    if not rows:
        return []
    lines = [f"### {reader}: the false sentence of a right answer, held out (copied: planted; paraphrased: added)", ""]
    for kind in ("planted", "added"):
        mine = [{**r, "dataset": f"{r['dataset']} {kind}"} for r in rows if r["kind"] == kind]
        if mine:
            part: dict = {}
            lines += [_planted(reader, mine, model, part), ""]
            results.setdefault(reader, {}).setdefault("false_sentence", {})[kind] = part.get(reader, {}).get("planted")
    return lines


def main() -> None:
    from midlens.eval.check_support import read_check_run
    from midlens.generators.answering.check import METHOD_CHECKED, CheckedSupportModel, shipped_checked_folder

    results: dict = {}
    lines = ["# Checking other models' sentence answers", ""]
    for reader_dir in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        reader = reader_dir.name
        train = [
            r for run in sorted(reader_dir.glob("*-train")) for r in read_check_run(run)[1] if r["sentence_labels"]
        ]
        if train:
            lines += feature_study(reader, train, results) + [""]
        folder = shipped_checked_folder(reader)
        sha = json.loads((folder / "meta.json").read_text())["base_model_sha256"]
        model, _ = CheckedSupportModel.load(folder, METHOD_CHECKED, sha)
        runs = sorted(
            p
            for p in reader_dir.iterdir()
            if p.is_dir() and "-by-" in p.name and not p.name.endswith(("-reader", "-train"))
        )
        lines += held_out(reader, model, runs, results) + [""]
        lines += reader_choice(reader, runs, results) + [""]
        lines += false_sentences(reader, model, sorted(reader_dir.glob("*-false-sentence")), results)
    (HERE / "sentences-report.md").write_text("\n".join(lines) + "\n")
    (HERE / "sentences-report.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
