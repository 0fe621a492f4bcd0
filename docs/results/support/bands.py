"""What each support band ("likely supported", "uncertain", "check this") means, in answers that were right: the
shipped support models' probabilities on the committed rows of runs/ (no generation), each answer put in its band
as `Support.band` puts it under the model's threshold in force, EM as the label.

    python docs/results/support/bands.py            # writes bands.json and bands.md next to this file

The train rows chose the bands' edges (generators/answering/support.py: LIKELY_FLOOR, UNLIKELY_BELOW); the held-out rows
(HotpotQA eval split, SQuAD's eval articles, KV) measure them: the default method's (runs/<model>/<corpus>), and each
other method's (runs/<model>/<method>/<corpus>: HotpotQA and SQuAD), each answer read with its own method.
"""

from __future__ import annotations

import json
from pathlib import Path

from midlens.eval.support import read_run
from midlens.generators.answering.support import BAND_WORDS, BANDS, METHOD_PLAIN, SupportModel, shipped_support_folder

HERE = Path(__file__).resolve().parent
RUNS = HERE / "runs"
MODELS = {"qwen": "qwen2.5-coder-0.5b", "smol": "smollm2-135m"}
CORPORA = ("hotpotqa", "squad", "kv")
_CORPUS_RUNS = {*CORPORA, *(f"{c}-train" for c in CORPORA)}  # a model's default-method runs; other folders: methods


def band_rows(short: str, split: str, method: str | None = None) -> list[tuple[str, int]]:
    """(band, right) of every answer of one model's runs of a split ("held-out" or "train"): the default method's,
    or those of `method` (its runs' folder)."""
    out = []
    folder = RUNS / short if method is None else RUNS / short / method
    for corpus in CORPORA:
        run = folder / (corpus if split == "held-out" else f"{corpus}-train")
        if not run.is_dir():
            continue
        config, rows = read_run(run)
        model, _ = SupportModel.load(
            shipped_support_folder(config["model"], False), METHOD_PLAIN, config["model_sha256"]
        )
        out += [(model.support(r["inputs"], r["method"]).band, int(r["em"] >= 0.5)) for r in rows]
    return out


def table() -> dict:
    """{model: {split: {band: {"answers": n, "right": share}}}}, the shares rounded to 3 places; another method's
    splits are "train, <method>" and "held-out, <method>"."""
    result: dict = {}
    for short, name in MODELS.items():
        methods = [None, *sorted(p.name for p in (RUNS / short).iterdir() if p.is_dir() and p.name not in _CORPUS_RUNS)]
        for method, split in ((m, s) for m in methods for s in ("train", "held-out")):
            rows = band_rows(short, split, method)
            if not rows:
                continue
            cells = {}
            for band in BANDS:
                labels = [y for b, y in rows if b == band]
                cells[band] = {"answers": len(labels), "right": round(sum(labels) / len(labels), 3) if labels else None}
            result.setdefault(name, {})[split if method is None else f"{split}, {method}"] = cells
    return result


def markdown(result: dict) -> str:
    lines = [
        "# Support bands: how often answers in each band were right (EM)",
        "",
        "Made by `python docs/results/support/bands.py` from the committed rows of `runs/`; the shipped support",
        "models, each model's threshold in force (its 80 %-train-precision threshold, never below 0.5). A split",
        "without a method is the default method's answers; `, <method>`: that method's (HotpotQA and SQuAD).",
        "",
        "| model | split | " + " | ".join(f"{BAND_WORDS[b].split(':')[0]}: answers, right %" for b in BANDS) + " |",
        "|---|---|" + "---|" * len(BANDS),
    ]
    for name, splits in result.items():
        for split, cells in splits.items():
            shown = [
                f"{c['answers']}, {'-' if c['right'] is None else round(100 * c['right'])}" for c in cells.values()
            ]
            lines.append(f"| {name} | {split} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    result = table()
    (HERE / "bands.json").write_text(json.dumps(result, indent=1) + "\n")
    (HERE / "bands.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
