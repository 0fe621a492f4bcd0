"""Support scores across answering methods (issue 74, E): a support model fitted on one method's answers is
over-confident on another's (SmolLM2's baseline: 0.59 mean support where 41 % were right), so each support model
records the methods whose train answers it was fitted on, every Support says which model answered and whether the
answer's method is among them, and an answer of any other method is never called "likely"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import planted_passages
from tests.test_support import _rows, inputs

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the secret code word of the Zorbland expedition?"


def _two_method_rows() -> list[dict]:
    """`_rows` answered by two methods, the second right less often for the same features (its first 20 right
    answers relabelled wrong): a method-agnostic fit without the method cannot calibrate both."""
    first = [{**r, "method": "mudaf(alpha=0)", "key": f"q{i}|1"} for i, r in enumerate(_rows())]
    second = [{**r, "method": "baseline", "key": f"q{i}|5"} for i, r in enumerate(_rows())]
    for r in [r for r in second if r["em"]][:10]:
        r["em"] = 0.0
    return first + second


def test_the_support_json_names_its_model_and_methods_and_flags_a_method_outside_them(loaded):
    """SmolLM2 (real weights, fp32) on a planted question: its fine-tune's and the baseline's answers are read
    by the shipped SmolLM2 support model, fitted on both (calibrated); attention-buckets' answers by the same model,
    which was not fitted on them: labelled so in the JSON and the words, and never "likely" (before, the JSON named
    neither the methods nor whether the answer's was among them, and the words claimed a calibration)."""
    from midlens.generators.answering.generator import Generator
    from midlens.generators.answering.support import BAND_WORDS
    from midlens.rag.pipeline import Pipeline

    seen = {}
    for method in ("finetuned", "baseline", "attention-buckets"):
        pipe = Pipeline(None, Generator(loaded, method=method), max_new_tokens=12)
        record = pipe.answer(QUESTION, planted_passages(5, 2)).to_dict()["support"]
        seen[method] = record
        assert record["model"] == "smollm2-135m" and "mudaf(alpha=0)" in record["methods"]
        assert "baseline" in record["methods"] and "attention-buckets" not in record["methods"]
    assert seen["finetuned"]["method"] == "mudaf(alpha=0)" and seen["finetuned"]["calibrated"] is True
    assert seen["baseline"]["method"] == "baseline" and seen["baseline"]["calibrated"] is True
    other = seen["attention-buckets"]
    assert other["method"] == "attention-buckets" and other["calibrated"] is False
    assert other["likely"] is False and other["band"] != "likely"
    assert other["words"].startswith(BAND_WORDS[other["band"]])
    assert "not calibrated for attention-buckets" in other["words"] and "smollm2-135m" in other["words"]
    assert "not calibrated" not in seen["baseline"]["words"]


def test_a_method_outside_the_fitted_set_is_never_likely_and_round_trips_through_json():
    from midlens.generators.answering.support import Support

    fitted = ("mudaf(alpha=0)", "baseline")
    inside = Support.at(0.9, 0.55, False, "smollm2-135m", fitted, "baseline")
    outside = Support.at(0.9, 0.55, False, "smollm2-135m", fitted, "moice")
    assert inside.likely and inside.calibrated
    assert inside.words == "likely supported (0.90; likely from 0.55, the support model's threshold)"
    assert not outside.likely and not outside.calibrated and outside.band == "uncertain"
    assert outside.under(0.1).likely is False  # no threshold a caller picks makes it calibrated
    for support in (inside, outside):
        back = Support.from_dict(json.loads(json.dumps(support.to_dict())))
        assert back == support and back.words == support.words


def test_the_method_feature_fits_each_methods_rate_saves_and_loads(tmp_path):
    """Fitted with method indicators, the two methods' answers of the same features get their own probabilities,
    each method's mean probability within 0.05 of its share right on the train rows (a logistic regression with an
    intercept per method matches each method's rate on its train rows up to the C = 1 shrinkage); without them the
    second method is over-confident. The artefact keeps the indicators and the methods."""
    from midlens.core.errors import ArtefactError
    from midlens.generators.answering.support import METHOD_PLAIN, SupportModel

    rows = _two_method_rows()
    for by_method in (False, True):
        model = SupportModel.fit(rows, verified=False, name="m", by_method=by_method)
        assert model.methods == ("baseline", "mudaf(alpha=0)")
        gaps = []
        for method in model.methods:
            mine = [r for r in rows if r["method"] == method]
            mean = sum(model.probability_of(r["inputs"], method) for r in mine) / len(mine)
            gaps.append(abs(mean - sum(r["em"] for r in mine) / len(mine)))
        assert (max(gaps) <= 0.05) is by_method
    assert model.features[-1] == "method=mudaf(alpha=0)"
    meta = {"method": model.method, "base_model": "m", "base_model_sha256": "sha", "options": {}}
    folder = model.save(tmp_path / "m", {**meta, "training": {}, "data": {}})
    back, _ = SupportModel.load(folder, METHOD_PLAIN, "sha")
    assert back.features == model.features and back.methods == model.methods
    row = rows[-1]["inputs"]
    assert back.probability_of(row, "baseline") == pytest.approx(model.probability_of(row, "baseline"), abs=1e-12)
    config = json.loads((folder / "meta.json").read_text())
    del config["support"]["methods"]
    (folder / "meta.json").write_text(json.dumps(config))
    with pytest.raises(ArtefactError, match="answering methods it was fitted on.*refit it on train-split runs"):
        SupportModel.load(folder, METHOD_PLAIN, "sha")


def test_a_verified_answer_of_a_method_the_verified_model_lacks_reads_the_plain_model(monkeypatch):
    """The other methods' train answers were not verified, so the verified model knows the default's only; a
    verified baseline answer is read by the plain model (calibrated for it) rather than the verified one (not)."""
    from midlens.generators.answering import support as support_module

    plain = support_module.SupportModel.fit(_two_method_rows(), verified=False, name="m")
    verified = support_module.SupportModel.fit(_two_method_rows()[:60], verified=True, name="m")
    monkeypatch.setattr(support_module, "_shipped_support", lambda _m, _sha, v: verified if v else plain)
    assert support_module.packaged_support("m", str, True, "baseline") is plain
    assert support_module.packaged_support("m", str, True, "mudaf(alpha=0)") is verified
    assert support_module.packaged_support("m", str, True, "moice") is verified  # neither: the one asked for
    assert verified.support(inputs(), "moice").calibrated is False


def test_eval_support_records_the_method_it_answered_with(tmp_path):
    from midlens.cli import build_parser
    from midlens.core.errors import MethodConfigError
    from midlens.eval.support import SupportRunOptions, plan

    args = build_parser().parse_args(
        [
            "eval",
            "support",
            "--model",
            "smollm2-135m",
            "--method",
            "ms-poe",
            "--dataset",
            "kv",
            "--n",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert args.method == "ms-poe"
    config, units, _ = plan(SupportRunOptions(out=tmp_path, dataset="kv", n=2, model="smollm2-135m", method="ms-poe"))
    assert config["method"]["name"] == "ms-poe" and len(units) == 6
    default, _, _ = plan(SupportRunOptions(out=tmp_path, dataset="kv", n=2, model="smollm2-135m"))
    assert default["method"] == {"name": "baseline"}  # the model's answering default
    with pytest.raises(MethodConfigError, match="unknown method 'ms-poo'"):
        plan(SupportRunOptions(out=tmp_path, dataset="kv", n=2, model="smollm2-135m", method="ms-poo"))


def test_the_shipped_support_models_are_what_their_committed_train_rows_fit(tmp_path):
    """Each shipped support model (plain and verified; SmolLM2's, Qwen's, the model-agnostic one) is what
    `midlens eval support-fit` gives on the train runs committed beside the report, every method's (coefficients
    within 1e-6: deterministic), with the methods, the method feature chosen by cross-validation and the data
    hashes recorded."""
    from midlens.eval.support import read_run
    from midlens.generators.answering.support import SupportModel, shipped_support_folder, support_method
    from midlens.training.support import fit_and_save

    runs_root = ROOT / "docs" / "results" / "support" / "runs"
    for model, tags in (("smollm2-135m", ("smol",)), ("qwen2.5-coder-0.5b", ("qwen",)), ("any", ("qwen", "smol"))):
        runs = sorted(p for tag in tags for p in (runs_root / tag).glob("**/*-train"))
        loaded = [read_run(r) for r in runs]
        fit_and_save(runs, loaded, tmp_path / model)
        for verified in (False, True):
            folder = shipped_support_folder(model, verified)
            meta = json.loads((folder / "meta.json").read_text())
            shipped, _ = SupportModel.load(folder, support_method(verified), meta["base_model_sha256"])
            refit, _ = SupportModel.load(
                tmp_path / model / ("verified" if verified else "plain"),
                support_method(verified),
                meta["base_model_sha256"],
            )
            assert shipped.features == refit.features and shipped.methods == refit.methods
            assert shipped.coef == pytest.approx(refit.coef, abs=1e-6)
            assert shipped.threshold == pytest.approx(refit.threshold)
            used = [c for c, _ in loaded if c.get("verify", True) or not verified]
            assert {c["data_sha256"] for c in used} == {run["data_sha256"] for run in meta["data"]["runs"]}
            assert set(shipped.methods) == set(meta["training"]["methods"])
