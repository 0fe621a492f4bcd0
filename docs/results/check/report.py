"""The held-out measurements of the checked support models (docs/results/check/README.md), from stored rows only.

Per reader and corpus: the answer-level AUROC (support = the weakest sentence's probability, against EM) of answers
written by the reader itself (`own`), by the other packaged model (`other`) and by Gemma 3 270M (`gemma`), beside
the mean token log-probability alone; for the planted answers (one false sentence in a right answer), how often the
lowest-scored sentence is the planted one and the sentence-level AUROC, beside the lowest token log-probability alone.
95 % intervals: percentile bootstrap over answers (1000 resamples, seed 0).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

RESAMPLES = 1000


def _auroc(scores: list[float], labels: list[int]) -> float | None:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores)) if 0 < sum(labels) < len(labels) else None


def _interval(groups: list[list[tuple[float, int]]]) -> tuple[float | None, float | None, float | None]:
    """AUROC over the pooled (score, label) pairs and its bootstrap interval, resampling `groups` (answers)."""
    pairs = [p for g in groups for p in g]
    point = _auroc([s for s, _ in pairs], [y for _, y in pairs])
    if point is None:
        return None, None, None
    rng = np.random.default_rng(0)
    values = []
    for _ in range(RESAMPLES):
        pick = rng.integers(0, len(groups), len(groups))
        sample = [p for i in pick for p in groups[i]]
        value = _auroc([s for s, _ in sample], [y for _, y in sample])
        if value is not None:
            values.append(value)
    return point, float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def _fmt(triple: tuple) -> str:
    point, low, high = triple
    return "n/a (one class)" if point is None else f"{point:.2f} [{low:.2f}, {high:.2f}]"


def _mean_logprob(inputs: dict) -> float:
    lps = inputs["token_logprobs"]
    return sum(lps) / len(lps) if lps else -20.0


def _sentence_min_logprob(inputs: dict, index: int) -> float:
    a, b = inputs["sentence_tokens"][index]
    lps = inputs["token_logprobs"][a:b]
    return min(lps) if lps else -20.0


def own_rows(reader: str, corpus: str) -> list[dict]:
    """The reader's own held-out answers as checked rows, from its support run (docs/results/support/runs): reading
    one's own greedy answer teacher-forced reproduces the generating pass's features (tests/test_check.py: 1e-4), so
    those rows are the checked rows of the answers over the prompt they were written on (10 passages; SmolLM2's
    restacked by MuDAF's evidence). Every one is a single sentence."""
    from midlens.eval.check_support import FOLDERS, SUPPORT_RUNS, _rows_by_key

    rows = []
    for r in _rows_by_key(SUPPORT_RUNS / FOLDERS[reader] / corpus).values():
        inputs = r["inputs"]
        if inputs["sentences"] != 1 or not inputs["token_logprobs"]:
            continue
        inputs = {**inputs, "sentence_tokens": [[0, len(inputs["token_logprobs"])]]}
        inputs["sentence_spans"] = [[0, len(inputs["text"])]]
        rows.append({**r, "kind": "own", "inputs": inputs, "sentence_labels": [int(r["em"] >= 0.5)]})
    return rows


def report(runs: Path, out: Path) -> dict:
    from midlens.eval.check_support import read_check_run
    from midlens.generators.answering.check import METHOD_CHECKED, CheckedSupportModel, shipped_checked_folder

    results: dict = {}
    lines = ["# Checked support, held out", ""]
    for reader_dir in sorted(p for p in runs.iterdir() if p.is_dir()):
        reader = reader_dir.name
        folder = shipped_checked_folder(reader)
        if not folder.is_dir():
            continue
        sha = json.loads((folder / "meta.json").read_text())["base_model_sha256"]
        model, _ = CheckedSupportModel.load(folder, METHOD_CHECKED, sha)
        lines += [
            f"## {reader} reading (threshold {model.threshold:.3f})",
            "",
            "| corpus | answers by | answers | right % | AUROC (EM) | mean log-prob alone | likely: share, right % |",
            "|---|---|---|---|---|---|---|",
        ]
        pooled: dict[str, list] = {}
        planted_rows: list[dict] = []
        reference: list[str] = []
        for run_dir in sorted(p for p in reader_dir.iterdir() if p.is_dir() and not p.name.endswith("-train")):
            config, rows = read_check_run(run_dir)
            rows = [r for r in rows if r["sentence_labels"]] + own_rows(reader, config["dataset"])
            for kind in ("own", "other", "gemma"):
                mine = [r for r in rows if r["kind"] == kind]
                if not mine:
                    continue
                support = [min(model.sentence_probabilities(r["inputs"])) for r in mine]
                labels = [int(r["em"] >= 0.5) for r in mine]
                base = [_mean_logprob(r["inputs"]) for r in mine]
                pooled.setdefault(kind, []).append((support, labels, base))
                line = _row(config["dataset"], kind, mine, support, labels, base, model.threshold)
                lines.append(line)
                results.setdefault(reader, {}).setdefault(config["dataset"], {})[kind] = _numbers(
                    support, labels, base, model.threshold
                )
            own = [r for r in rows if r["kind"] == "own"]
            if own:  # the same answers under the generation-time model, which read them as they were written
                generated = _generation_time(reader, own)
                results[reader][config["dataset"]]["own"]["generation_time_auroc"] = generated
                reference.append(f"{config['dataset']} {_fmt(generated)}")
            planted_rows += [r for r in rows if r["kind"] == "planted"]
        for kind, parts in pooled.items():
            support = [s for p in parts for s in p[0]]
            labels = [y for p in parts for y in p[1]]
            base = [b for p in parts for b in p[2]]
            lines.append(_row("**all**", kind, support, support, labels, base, model.threshold))
            results.setdefault(reader, {}).setdefault("all", {})[kind] = _numbers(
                support, labels, base, model.threshold
            )
        if reference:
            lines += ["", "The own answers under the generation-time support model (AUROC): " + "; ".join(reference)]
        if planted_rows:
            lines += ["", _planted(reader, planted_rows, model, results)]
        lines.append("")
    (out / "support-report.md").write_text("\n".join(lines) + "\n")
    (out / "support-report.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("\n".join(lines))
    return results


def _generation_time(reader: str, rows: list[dict]) -> tuple:
    from midlens.generators.answering.support import packaged_support, support_features
    from midlens.generators.models.model_cache import content_sha256

    model = packaged_support(reader, lambda: content_sha256(reader), verified=False)
    scores = [model.probability(support_features(r["inputs"], False)) for r in rows]
    return _interval([[(p, int(r["em"] >= 0.5))] for p, r in zip(scores, rows, strict=True)])


def _numbers(support: list[float], labels: list[int], base: list[float], threshold: float) -> dict:
    auroc = _interval([[(s, y)] for s, y in zip(support, labels, strict=True)])
    base_auroc = _interval([[(b, y)] for b, y in zip(base, labels, strict=True)])
    likely = [y for s, y in zip(support, labels, strict=True) if s >= max(threshold, 0.5)]
    return {
        "answers": len(labels),
        "right": sum(labels),
        "auroc": auroc,
        "mean_logprob_auroc": base_auroc,
        "likely": len(likely),
        "likely_right": sum(likely),
    }


def _row(corpus, kind, rows, support, labels, base, threshold) -> str:
    n = _numbers(support, labels, base, threshold)
    share = n["likely"] / max(1, n["answers"])
    right = f"{100 * n['likely_right'] / n['likely']:.0f}" if n["likely"] else "-"
    return (
        f"| {corpus} | {kind} | {n['answers']} | {100 * n['right'] / max(1, n['answers']):.1f} | {_fmt(n['auroc'])} | "
        f"{_fmt(n['mean_logprob_auroc'])} | {100 * share:.0f} %, {right} |"
    )


def _planted(reader: str, rows: list[dict], model, results: dict) -> str:
    """Localisation of the planted sentence: lowest-scored sentence is the planted one (top-1), against chance
    (1 / sentences) and the lowest token log-probability alone; sentence-level AUROC over every sentence."""
    by_corpus: dict[str, list[dict]] = {}
    for r in rows:
        by_corpus.setdefault(r["dataset"], []).append(r)
    by_corpus["all"] = rows
    lines = [
        "| planted answers | answers | sentences | lowest is planted (support) | by lowest token log-prob | chance | "
        "sentence AUROC (support) | by lowest token log-prob |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for corpus, group in by_corpus.items():
        usable = [r for r in group if 0 < sum(r["sentence_labels"]) < len(r["sentence_labels"])]
        hits = base_hits = 0
        chance = 0.0
        groups, base_groups = [], []
        for r in usable:
            probs = model.sentence_probabilities(r["inputs"])
            lows = [_sentence_min_logprob(r["inputs"], i) for i in range(len(probs))]
            labels = r["sentence_labels"]
            hits += labels[int(np.argmin(probs))] == 0
            base_hits += labels[int(np.argmin(lows))] == 0
            chance += 1 / len(labels)
            groups.append(list(zip(probs, labels, strict=True)))
            base_groups.append(list(zip(lows, labels, strict=True)))
        n = len(usable)
        if not n:
            continue
        auroc, base_auroc = _interval(groups), _interval(base_groups)
        sentences = sum(len(r["sentence_labels"]) for r in usable)
        lines.append(
            f"| {corpus} | {n} | {sentences} | {100 * hits / n:.0f} % ({hits}) | {100 * base_hits / n:.0f} % | "
            f"{100 * chance / n:.0f} % | {_fmt(auroc)} | {_fmt(base_auroc)} |"
        )
        results.setdefault(reader, {}).setdefault("planted", {})[corpus] = {
            "answers": n,
            "sentences": sentences,
            "lowest_is_planted": hits,
            "lowest_logprob_is_planted": base_hits,
            "chance": chance / n if n else math.nan,
            "sentence_auroc": auroc,
            "sentence_min_logprob_auroc": base_auroc,
        }
    return "\n".join(lines)
