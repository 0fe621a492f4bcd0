"""Fitting the support models (generators.answering.support) on the rows of train-split `eval support` runs, and saving
them as verified artefacts (the shipped folders by default).

`SupportModel.fit` is the estimator (a logistic regression, its threshold chosen on the same rows); this module picks
the rows (train splits only), records where they came from, and writes the plain and the verified model. Runs of
several answering methods make one method-agnostic model, calibrated for each of them: whether it reads the method
as a feature is chosen by cross-validation on the same train rows (`method_feature_cv`), never on held-out ones.
The verified model reads the ablation drops, so only runs that verified their citations feed it.
"""

from __future__ import annotations

from pathlib import Path

from midlens.core.errors import InvalidArgumentError, Step
from midlens.generators.answering.support import GENERIC, C, SupportModel, shipped_support_folder

FOLDS = 5


def method_feature_cv(rows: list[dict], verified: bool, folds: int = FOLDS) -> dict:
    """Out-of-fold log-loss of the model without and with method indicators, per method and as their mean (each
    method weighs the same: every method's answers must be calibrated, not the most numerous), folds grouped by
    question so one question's answers (its slots, its methods) never sit on both sides. Proper scoring: log-loss
    rewards calibration and separation alike."""
    import numpy as np
    from sklearn.metrics import log_loss
    from sklearn.model_selection import GroupKFold

    methods = list(dict.fromkeys(r["method"] for r in rows))
    groups = [r["key"].rsplit("|", 1)[0] for r in rows]
    labels = np.asarray([int(r["em"] >= 0.5) for r in rows])
    out: dict = {"folds": folds, "methods": methods}
    for by_method in (False, True):
        predicted = np.zeros(len(rows))
        for train, test in GroupKFold(n_splits=folds).split(rows, labels, groups):
            model = SupportModel.fit([rows[i] for i in train], verified, GENERIC, by_method=by_method)
            predicted[test] = [model.probability_of(rows[i]["inputs"], rows[i]["method"]) for i in test]
        per_method = {}
        for m in methods:
            idx = [i for i, r in enumerate(rows) if r["method"] == m]
            per_method[m] = {
                "answers": len(idx),
                "right": float(labels[idx].mean()),
                "mean_probability": float(predicted[idx].mean()),
                "log_loss": float(log_loss(labels[idx], predicted[idx], labels=[0, 1])),
            }
        out["with_method" if by_method else "without_method"] = {
            "mean_log_loss": float(np.mean([v["log_loss"] for v in per_method.values()])),
            "per_method": per_method,
        }
    out["chosen"] = (
        "with_method"
        if out["with_method"]["mean_log_loss"] < out["without_method"]["mean_log_loss"]
        else "without_method"
    )
    return out


def fit_and_save(runs: list[Path], loaded: list[tuple[dict, list[dict]]], out: Path | None = None) -> list[Path]:
    """Fit the plain and verified support models on `loaded` (the config and rows of each of `runs`: train-split runs
    of one model, or of several: then the model-agnostic one; of one answering method or several) and save each as an
    artefact (default: the shipped folders)."""
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
    saved = []
    for verified in (False, True):
        # The drops exist only where the run verified its citations (a run without them reads 0 for every drop).
        used = [(c, rs) for c, rs in loaded if c.get("verify", True) or not verified]
        if not used:
            raise InvalidArgumentError(
                f"{', '.join(map(str, runs))}: none verified its citations; the verified support model needs at least "
                "one run made without --no-verify."
            )
        rows = [r for _, rs in used for r in rs]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        cv = method_feature_cv(rows, verified) if len(methods) > 1 else None
        by_method = cv is not None and cv["chosen"] == "with_method"
        model = SupportModel.fit(rows, verified, name, by_method=by_method)
        folder = (out / ("verified" if verified else "plain")) if out else shipped_support_folder(name, verified)
        training = {
            "estimator": f"sklearn LogisticRegression(C={C}) on standardised features",
            "label": "best_subspan_em >= 0.5",
            "answers": len(rows),
            "right": sum(int(r["em"] >= 0.5) for r in rows),
            "methods": {m: sum(r["method"] == m for r in rows) for m in methods},
            "method_feature": by_method,
            "method_feature_cv": cv,
        }
        # One list of runs, whoever's answers they hold: every support artefact's meta has the same keys.
        data = {
            "answers": len(rows),
            "runs": [
                {
                    "dataset": c["dataset"],
                    "model": c["model"],
                    "method": rs[0]["method"] if rs else None,
                    "verify": c.get("verify", True),
                    "answers": len(rs),
                    "data_sha256": c["data_sha256"],
                    "n": c["n"],
                    "seed": c["seed"],
                    "positions": c["positions"],
                }
                for c, rs in used
            ],
        }
        meta = {"method": model.method, "base_model": name, "base_model_sha256": sha, "options": {}}
        saved.append(model.save(folder, {**meta, "training": training, "data": data}))
    return saved
