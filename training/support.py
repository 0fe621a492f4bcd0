"""Fitting the support models (generators.support) on the rows of train-split `eval support` runs, and saving them as
verified artefacts (the shipped folders by default).

`SupportModel.fit` is the estimator (a logistic regression, its threshold chosen on the same rows); this module picks
the rows (train splits only), records where they came from, and writes the plain and the verified model.
"""

from __future__ import annotations

from pathlib import Path

from midlens.core.errors import InvalidArgumentError, Step
from midlens.generators.support import GENERIC, C, SupportModel, shipped_support_folder


def fit_and_save(runs: list[Path], loaded: list[tuple[dict, list[dict]]], out: Path | None = None) -> list[Path]:
    """Fit the plain and verified support models on `loaded` (the config and rows of each of `runs`: train-split runs
    of one model, or of several: then the model-agnostic one) and save each as an artefact (default: the shipped
    folders)."""
    not_train = [str(r) for r, (c, _) in zip(runs, loaded, strict=True) if not c["dataset"].endswith("-train")]
    if not_train:
        runs_step = Step(
            "support-runs",
            "make train-split runs (midlens.eval.support: SupportRunOptions(split='train'))",
            {"split": "train", "out": None},
        )
        raise InvalidArgumentError(
            f"{', '.join(not_train)}: held-out runs; a support model is fitted on train-split runs only.", [runs_step]
        )
    models = sorted({c["model"] for c, _ in loaded})
    name = models[0] if len(models) == 1 else GENERIC
    sha = loaded[0][0]["model_sha256"] if len(models) == 1 else GENERIC
    rows = [r for _, rs in loaded for r in rs]
    # One list of runs, whoever's answers they hold: every support artefact's meta has the same keys.
    data = {
        "answers": len(rows),
        "runs": [
            {
                "dataset": c["dataset"],
                "model": c["model"],
                "answers": len(rs),
                "data_sha256": c["data_sha256"],
                "n": c["n"],
                "seed": c["seed"],
                "positions": c["positions"],
            }
            for c, rs in loaded
        ],
    }
    saved = []
    for verified in (False, True):
        model = SupportModel.fit(rows, verified, name)
        folder = (out / ("verified" if verified else "plain")) if out else shipped_support_folder(name, verified)
        training = {
            "estimator": f"sklearn LogisticRegression(C={C}) on standardised features",
            "label": "best_subspan_em >= 0.5",
            "answers": len(rows),
            "right": sum(int(r["em"] >= 0.5) for r in rows),
        }
        meta = {"method": model.method, "base_model": name, "base_model_sha256": sha, "options": {}}
        saved.append(model.save(folder, {**meta, "training": training, "data": data}))
    return saved
