"""Can this answer be trusted? A calibrated probability that it is right, read from the pass that generated it.

Every signal comes from what the answering pass already computed (no second sample, no extra forward pass):
  confidence   the answer tokens' own log-probabilities when they were picked (mean, lowest, first), how decided each
               step was (top-1 minus top-2 log-probability) and the answer's length;
  citations    how much of each answer sentence's attention went to the passage it cites, and how peaked it was;
  evidence     whether the cited passage is the one the prompt's evidence ranks first, and how peaked the evidence is;
  agreement    whether the answer's attention (its attribution) falls on the passage the prompt's evidence ranks first;
  grounding    how many of the answer's words occur in the sentence it cites, and in the passage;
  and, when the citations were verified (`Generator.verify`), how many nats the answer loses without its cited
  passage (the ablation drop), a causal check the rest only approximates.

`support_inputs(answer)` reduces an Answer to the plain values those read (eval rows store them, so a model is fitted
and re-measured without the language model); `support_features(inputs, verified)` is the one computation of the
features; `SupportModel` is a logistic regression over them, fitted on the TRAIN split by
`midlens eval support-fit` (training/support.py) and shipped as a verified artefact per packaged model, with a
model-agnostic one (fitted on both packaged models' rows) for any other model. Its threshold, chosen on the same
train rows for a stated precision, says which answers are "likely supported" and, where asked, which to withhold.

The words follow the number (`Support.band`): "likely supported" needs the threshold in force (the model's, or the
caller's `abstain_below`) and a probability of at least LIKELY_FLOOR; "uncertain" is the middle band down to
UNLIKELY_BELOW; below that, "check this". A withheld answer is below the threshold in force, so never "likely".
`Support.words` (the shells, the JSON, the server) and `Support.plain` (the demo's first screen) are the one place
the support is put in words: each names where "likely" starts and who set it, and prints the probability with as
many decimals as keep it on its band's side of each edge (0.196 is "0.196" in the band below 0.2, never "0.20").
An answer to no passages says so instead of a band: nothing could support it; nor is an answer that restates the
question (core.answer_text.restates_question) rated: it is no answer (`Support.no_answer`, the band NO_ANSWER).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import torch

from midlens.core.answer_text import normalize_answer
from midlens.core.errors import ArtefactError, InvalidArgumentError, Step
from midlens.core.saved_parts import Artefact, SavedPart, Section
from midlens.generators.models.shipped import SHIPPED

# The features, in the order a model's coefficients follow. PLAIN need only the generating pass; VERIFIED add the
# ablation drops of `Generator.verify`.
PLAIN_FEATURES = (
    "mean_logprob",
    "min_logprob",
    "first_logprob",
    "log_tokens",
    "first_margin",
    "min_margin",
    "top_share",
    "share_margin",
    "cited_sources",
    "cited_is_top_evidence",
    "evidence_peak",
    "attribution_on_top_evidence",
    "words_in_cited_sentence",
    "words_in_cited_passage",
)
VERIFIED_FEATURES = (*PLAIN_FEATURES, "max_drop", "verified_share")
# A drop is clipped here: past a few nats the answer plainly rests on the passage, and one huge drop would dominate.
DROP_CLIP = 8.0
MARGIN_CLIP = 10.0  # a step decided by 10 nats is decided; beyond that is the tokenizer's noise
GENERIC = "any"  # the folder of the model-agnostic support model
METHOD_FEATURE = "method="  # an indicator feature's prefix: "method=baseline" is 1.0 for the baseline's answers
METHOD_PLAIN, METHOD_VERIFIED = "support", "support-verified"
SECTION = Section(
    "support",
    {"features": list, "threshold": float, "target_precision": float, "label": str},
)
ABSTAIN_TEXT = "I could not find this in the passages."

# The share of "likely supported" answers that must be right on the train rows: 4 in 5, chosen on the train rows
# (0.6 called 90 % of the default model's train answers likely, as its base rate is 54 %; 0.8 keeps 59 % of them and
# flags 74 % of its wrong ones), before any held-out answer was scored.
TARGET_PRECISION = 0.8
# "Likely" must mean more likely right than wrong: a model's 80 %-precision threshold may fall below 0.5 (the default
# model's is 0.451), and then "likely supported (0.49)" contradicted its own number.
LIKELY_FLOOR = 0.5
# The lower edge of the "uncertain" band, chosen on the train rows (docs/results/support, train runs): the highest cut,
# in steps of 0.05, below which each packaged model's train answers are right at most 1 in 8 (0.2: 10.7 % of the
# default model's, 6.1 % of SmolLM2's; 0.25: 13.2 %). Held out (docs/results/support/bands.md), answers right in each
# band, likely / uncertain / check this: the default model 80 / 43 / 12 %, SmolLM2 55 / 45 / 6 % (its model refitted
# with the baseline's and ms-poe's train answers; 52 / 42 / 5 % before).
UNLIKELY_BELOW = 0.2
BANDS = ("likely", "uncertain", "unlikely")
# The band of an answer given no passage: no band of the support model applies, as nothing could support it.
NO_PASSAGES = "none"
# The band of an answer that restates the question: there is no answer to rate, whatever the features say.
NO_ANSWER = "no-answer"
# Who set a Support's threshold in force: the support model (its 80 %-precision threshold, never below
# LIKELY_FLOOR), or the caller's `abstain_below`.
BY_MODEL, BY_CALLER = "model", "abstain_below"
C = 1.0  # scikit-learn's default regularisation; not tuned (a few hundred rows, a dozen features)
MIN_COVERAGE = 0.1


def decimals(p: float, *edges: float) -> int:
    """The fewest decimals, at least 2, at which `p` printed stays on its side of each of `edges` printed alike:
    0.196 and a 0.2 edge need 3 ("0.196", not "0.20"); 0.656 against a 0.6562 threshold needs 4."""
    for digits in range(2, 18):
        if all((p >= e) == (float(f"{p:.{digits}f}") >= float(f"{e:.{digits}f}")) for e in edges):
            return digits
    return 17  # two distinct floats in [0, 1] differ by the 17th decimal


def shown(p: float, *edges: float) -> str:
    """`p` printed with `decimals(p, *edges)` decimals."""
    return f"{p:.{decimals(p, *edges)}f}"


def choose_threshold(probabilities: list[float], labels: list[int], target: float) -> float:
    """The lowest probability whose answers (those at or above it) are right at least `target` of the time; where none
    is, the one of highest precision among those keeping at least MIN_COVERAGE of the answers."""
    pairs = sorted(zip(probabilities, labels, strict=True), key=lambda x: -x[0])
    right = 0
    best, best_precision = pairs[0][0], -1.0
    lowest_meeting = None
    for i, (p, y) in enumerate(pairs, start=1):
        right += y
        precision = right / i
        if i < len(pairs) and pairs[i][0] == p:
            continue  # a threshold keeps every answer of equal probability
        if precision >= target:
            lowest_meeting = p
        if i >= MIN_COVERAGE * len(pairs) and precision > best_precision:
            best, best_precision = p, precision
    return float(lowest_meeting if lowest_meeting is not None else best)


def _word_set(text: str) -> set[str]:
    return set(normalize_answer(text).split())


def support_inputs(answer) -> dict:
    """The plain values of an Answer (generators.answering.answer.Answer) the features read: JSON-ready."""
    sources = []
    for index, citation in enumerate(answer.citations):
        for rank, source in enumerate(citation.sources):
            passage = answer.passages[source.position - 1].passage
            sentence = None if source.sentence is None else passage.text[source.sentence[0] : source.sentence[1]]
            sources.append(
                {
                    "sentence_index": index,
                    "rank": rank,
                    "position": source.position,
                    "share": source.score,
                    "sentence": sentence,
                    "passage": passage.text,
                    "drop": source.logprob_drop,
                    "verified": source.verified,
                }
            )
    return {
        "text": answer.text,
        "token_logprobs": list(answer.token_logprobs),
        "token_margins": list(answer.token_margins),
        "sentences": len(answer.citations),
        "sources": sources,
        "evidence": [pe.score for pe in answer.passages],
        "attribution": [pe.answer_attribution for pe in answer.passages],
    }


def _shares(values: list[float]) -> list[float]:
    clipped = [max(0.0, v) for v in values]
    total = sum(clipped)
    return [v / total for v in clipped] if total > 0 else [0.0] * len(values)


def support_features(inputs: dict, verified: bool = False) -> dict[str, float]:
    """The features of one answer (`support_inputs`), PLAIN_FEATURES or, with `verified`, VERIFIED_FEATURES."""
    lps = inputs["token_logprobs"]
    margins = inputs.get("token_margins") or []
    words = _word_set(inputs["text"])
    tops = [s for s in inputs["sources"] if s["rank"] == 0]
    # A source sentence's top share is its first source's; the margin over the second says how sure the choice was.
    seconds = {s["sentence_index"]: s["share"] for s in inputs["sources"] if s["rank"] == 1}
    evidence = inputs["evidence"]
    top_evidence = max(range(len(evidence)), key=lambda i: evidence[i]) + 1 if evidence else 0
    attribution = [a for a in inputs["attribution"] if a is not None]
    attribution_shares = _shares(attribution) if len(attribution) == len(evidence) else []

    def covered(field: str) -> float:
        if not words:
            return 0.0
        text = " ".join(s[field] or "" for s in tops)
        return len(words & _word_set(text)) / len(words)

    features = {
        "mean_logprob": sum(lps) / len(lps) if lps else -20.0,
        "min_logprob": min(lps) if lps else -20.0,
        "first_logprob": lps[0] if lps else -20.0,
        "log_tokens": math.log1p(len(lps)),
        # How decided the first step (what the answer is about) and the least decided step were, in nats.
        "first_margin": min(MARGIN_CLIP, margins[0]) if margins else 0.0,
        "min_margin": min(MARGIN_CLIP, min(margins)) if margins else 0.0,
        "top_share": sum(s["share"] for s in tops) / len(tops) if tops else 0.0,
        "share_margin": (
            sum(s["share"] - seconds.get(s["sentence_index"], 0.0) for s in tops) / len(tops) if tops else 0.0
        ),
        "cited_sources": len({s["position"] for s in inputs["sources"]}),
        "cited_is_top_evidence": (sum(s["position"] == top_evidence for s in tops) / len(tops) if tops else 0.0),
        "evidence_peak": max(_shares(evidence), default=0.0),
        "attribution_on_top_evidence": attribution_shares[top_evidence - 1] if attribution_shares else 0.0,
        "words_in_cited_sentence": covered("sentence"),
        "words_in_cited_passage": covered("passage"),
    }
    if verified:
        drops = [min(DROP_CLIP, s["drop"]) for s in inputs["sources"] if s["drop"] is not None]
        checked = [s["verified"] for s in inputs["sources"] if s["verified"] is not None]
        features["max_drop"] = max(drops, default=0.0)
        features["verified_share"] = sum(checked) / len(checked) if checked else 0.0
    return features


@dataclass(frozen=True)
class Support:
    """How far one answer can be trusted: `probability` that it is right (calibrated on the train split);
    `threshold`, the one in force (the support model's, never below LIKELY_FLOOR, or the caller's `abstain_below`:
    `threshold_by` says which); `likely` when the probability reaches it and LIKELY_FLOOR and the support model was
    fitted on the answering method's answers; `verified` when the ablation drops were read; `methods`, the answering
    methods (specs) whose train answers the support model was fitted on, and `method`, the one that answered (None:
    not recorded); `passages_given`, whether any passage was given (without one, nothing could support the answer);
    `answered`, False where the answer restates the question (`no_answer`): the probability is kept as the model gave
    it, but nothing is rated, never "likely", and `abstain` withholds it."""

    probability: float
    likely: bool
    threshold: float
    verified: bool
    model: str  # the support model's folder name: the answering model's, or GENERIC
    methods: tuple[str, ...] = field(default=(), kw_only=True)
    method: str | None = field(default=None, kw_only=True)
    threshold_by: str = field(default=BY_MODEL, kw_only=True)
    passages_given: bool = field(default=True, kw_only=True)
    answered: bool = field(default=True, kw_only=True)

    @classmethod
    def at(
        cls,
        probability: float,
        threshold: float,
        verified: bool,
        model: str,
        methods: tuple[str, ...] = (),
        method: str | None = None,
        *,
        threshold_by: str = BY_MODEL,
        passages_given: bool = True,
        answered: bool = True,
    ) -> Support:
        """The support of `probability` under the threshold in force, for an answer of `method`."""
        calibrated = method is None or method in methods
        likely = answered and passages_given and calibrated and probability >= max(threshold, LIKELY_FLOOR)
        return cls(
            probability,
            likely,
            threshold,
            verified,
            model,
            methods=tuple(methods),
            method=method,
            threshold_by=threshold_by,
            passages_given=passages_given,
            answered=answered,
        )

    def under(self, threshold: float) -> Support:
        """The same probability under another threshold in force (a caller's `abstain_below`)."""
        return Support.at(
            self.probability,
            threshold,
            self.verified,
            self.model,
            self.methods,
            self.method,
            threshold_by=BY_CALLER,
            passages_given=self.passages_given,
            answered=self.answered,
        )

    def no_answer(self) -> Support:
        """The same support of an answer that restates the question: unrated, and never "likely"."""
        return replace(self, likely=False, answered=False)

    @property
    def calibrated(self) -> bool:
        """Whether the support model was fitted on answers of the method that answered: another method's answers are
        right at another rate for the same features (SmolLM2's baseline: 0.59 mean support, 41 % right), so the
        probability is not a calibrated one and never reads "likely"."""
        return self.method is None or self.method in self.methods

    @property
    def band(self) -> str:
        """ "likely", "uncertain" (from UNLIKELY_BELOW up to the likely threshold) or "unlikely"; NO_ANSWER for an
        answer that restates the question, NO_PASSAGES for one given no passage."""
        if not self.answered:
            return NO_ANSWER
        if not self.passages_given:
            return NO_PASSAGES
        if self.likely:
            return "likely"
        return "uncertain" if self.probability >= UNLIKELY_BELOW else "unlikely"

    @property
    def likely_from(self) -> float:
        """The probability "likely supported" starts at: the threshold in force, never below LIKELY_FLOOR."""
        return max(self.threshold, LIKELY_FLOOR)

    @property
    def support_model(self) -> str:
        """The support model by name, as the words say it."""
        return "the model-agnostic support model" if self.model == GENERIC else f"{self.model}'s support model"

    def _edges(self) -> tuple[float, ...]:
        # The edges the words print the probability against: "likely" is one only where the words name it.
        return (UNLIKELY_BELOW, self.likely_from) if self.calibrated else (UNLIKELY_BELOW,)

    def _edge_decimals(self) -> int:
        # Those that keep the probability on its side of where "likely" starts: where it needs more for the 0.2
        # edge, it lies far below this one, so the two printed alike at fewer decimals still read in order.
        return decimals(self.probability, self.likely_from)

    def _set_by(self) -> str:
        if self.threshold_by != BY_CALLER:
            return "the support model's threshold"
        if self.threshold >= LIKELY_FLOOR:
            return "set by abstain_below"
        return f"abstain_below {self.threshold:g} raised to the {LIKELY_FLOOR:g} floor"

    @property
    def words(self) -> str:
        """The support as the shells print it and the JSON carries it: the band's words, the probability, and where
        "likely" starts and who set it (or, for a method the support model was not fitted on, that it was not)."""
        if self.band in (NO_ANSWER, NO_PASSAGES):
            return BAND_WORDS[self.band]
        p = shown(self.probability, *self._edges())
        if self.calibrated:
            edge = f"{self.likely_from:.{self._edge_decimals()}f}"
            return f"{BAND_WORDS[self.band]} ({p}; likely from {edge}, {self._set_by()})"
        return (
            f"{BAND_WORDS[self.band]} ({p}, not calibrated for {self.method}: {self.support_model} was fitted on "
            f"answers of {', '.join(self.methods) or 'no recorded method'})"
        )

    def plain(self, method: str | None = None) -> str:
        """The support for a reader who reads no probabilities (the demo's first screen): how often answers scored
        like this one are right, out of 100, and from how many "likely supported" starts; for a method the support
        model was not fitted on (`method`: its name as the reader knows it, else the spec), that this is not known;
        for an answer that restates the question, that it is no answer; for an answer given no passage, that nothing
        could support it."""
        if not self.answered:
            return "the model restated the question instead of answering it, so there is no answer to rate"
        if not self.passages_given:
            return "no passages were given, so nothing could support it"
        if not self.calibrated:
            return (
                f"how often answers like this one are right is not known for {method or self.method}: the support "
                "model was not fitted on its answers"
            )
        share = f"{100 * self.probability:.{decimals(self.probability, *self._edges()) - 2}f}"
        edge = f"{100 * self.likely_from:.{self._edge_decimals() - 2}f}"
        by = ", as abstain_below sets it" if self.threshold_by == BY_CALLER and self.threshold >= LIKELY_FLOOR else ""
        return f"about {share} in 100 answers scored like this one are right (likely supported from {edge} in 100{by})"

    def to_dict(self) -> dict:
        return {**asdict(self), "band": self.band, "words": self.words, "calibrated": self.calibrated}

    @classmethod
    def from_dict(cls, data: dict) -> Support:
        """The Support `to_dict` wrote (a server's JSON): its derived keys (band, words, calibrated) dropped."""
        fields_ = {k: v for k, v in data.items() if k not in ("band", "words", "calibrated")}
        fields_["methods"] = tuple(fields_.get("methods") or ())
        return cls(**fields_)


# What each band says to a reader (the CLI's `support:` line, the JSON's `words`, the demo's badge).
BAND_WORDS = {
    "likely": "likely supported",
    "uncertain": "uncertain: check it against the passages",
    "unlikely": "check this: the passages may not support it",
    NO_PASSAGES: "no passages were given: nothing could support it",
    NO_ANSWER: "no answer: it restates the question, so there is nothing to rate",
}


def standardised_logistic_fit(x, y) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], float]:
    """(mean, scale, coefficients, intercept) of scikit-learn's logistic regression (C = `C`, not tuned) on the
    standardised features `x` (rows x features, numpy) labelled `y`: the recipe every support model is fitted by.
    A constant feature keeps scale 1 (it standardises to 0 rather than dividing by zero)."""
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    fitted = LogisticRegression(C=C, max_iter=2000).fit((x - mean) / scale, y)
    return tuple(mean.tolist()), tuple(scale.tolist()), tuple(fitted.coef_[0].tolist()), float(fitted.intercept_[0])


@dataclass(frozen=True)
class SupportModel(SavedPart):
    """Logistic regression over standardised features: p = sigmoid(intercept + coef . (x - mean) / scale)."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float
    target_precision: float
    label: str  # what "right" meant when it was fitted (e.g. "em")
    name: str = GENERIC
    # The answering methods (specs) whose train answers it was fitted on: its probabilities are calibrated for these.
    methods: tuple[str, ...] = ()

    @property
    def verified(self) -> bool:
        return "max_drop" in self.features

    def probability(self, features: dict[str, float]) -> float:
        terms = zip(self.features, self.mean, self.scale, self.coef, strict=True)
        z = self.intercept + sum(c * (features[f] - m) / s for f, m, s, c in terms)
        return 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, z))))

    def features_of(self, inputs: dict, method: str | None = None) -> dict[str, float]:
        """The features of one answer (`support_inputs`) of `method` this model reads, its method indicators
        (`method=<spec>`, where it was fitted with them) included."""
        return {**support_features(inputs, self.verified), **method_indicators(self.features, method)}

    def probability_of(self, inputs: dict, method: str | None = None) -> float:
        return self.probability(self.features_of(inputs, method))

    def support(self, inputs: dict, method: str | None = None) -> Support:
        """The support of one answer (`support_inputs`) of `method` (its spec; None: not recorded)."""
        p = self.probability_of(inputs, method)
        threshold = max(self.threshold, LIKELY_FLOOR)
        given = bool(inputs["evidence"])  # one evidence score per passage given
        return Support.at(p, threshold, self.verified, self.name, self.methods, method, passages_given=given)

    @classmethod
    def fit(
        cls,
        rows: list[dict],
        verified: bool,
        name: str,
        target_precision: float = TARGET_PRECISION,
        only: tuple[str, ...] | None = None,
        by_method: bool = False,
    ) -> SupportModel:
        """Fit on `rows` (train-split `eval support` rows: `inputs`, `em` and `method`, the answering method's spec):
        a logistic regression (scikit-learn) over the standardised features, labelled by EM, and its threshold for
        `target_precision` on the same rows; the methods it is calibrated for are the rows'. `only`: a subset of the
        features (the log-probability baseline the reports compare against). `by_method`: an indicator feature per
        method but the rows' first, so each method's answers get a rate of their own."""
        import numpy as np

        # Rows without a method (made by hand) calibrate it for no method: its words will say so for every answer.
        # Sorted: the same rows in any order of runs fit the same model (the first method has no indicator).
        methods = tuple(sorted({r["method"] for r in rows if r.get("method") is not None}))
        features = only or (VERIFIED_FEATURES if verified else PLAIN_FEATURES)
        if by_method:
            features = (*features, *(f"{METHOD_FEATURE}{m}" for m in methods[1:]))

        def values(row: dict) -> dict[str, float]:
            return {**support_features(row["inputs"], verified), **method_indicators(features, row.get("method"))}

        x = np.asarray([[values(r)[f] for f in features] for r in rows], dtype=float)
        y = np.asarray([int(r["em"] >= 0.5) for r in rows])
        if len(set(y.tolist())) < 2:
            raise InvalidArgumentError(f"the {len(rows)} train answers are all {'right' if y[0] else 'wrong'}: no fit.")
        model = cls(
            tuple(features),
            *standardised_logistic_fit(x, y),
            0.5,
            target_precision,
            "em",
            name,
            methods,
        )
        # The threshold is one of these probabilities: computed as `support` computes them (not scikit-learn's
        # predict_proba, which rounds differently), so the train answer that set it stays on its side.
        probabilities = [model.probability(dict(zip(features, row, strict=True))) for row in x.tolist()]
        return replace(model, threshold=choose_threshold(probabilities, y.tolist(), target_precision))

    SECTION: ClassVar[Section] = SECTION

    def config(self) -> dict:
        return {
            "features": list(self.features),
            "threshold": float(self.threshold),
            "target_precision": float(self.target_precision),
            "label": self.label,
            "methods": list(self.methods),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        tensors = {
            name: torch.tensor(values, dtype=torch.float64)
            for name, values in (("mean", self.mean), ("scale", self.scale), ("coef", self.coef))
        }
        tensors["intercept"] = torch.tensor([self.intercept], dtype=torch.float64)
        return tensors

    @property
    def method(self) -> str:
        """The artefact method it is saved under: plain, or reading the verification drops."""
        return support_method(self.verified)

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact) -> SupportModel:
        """The model its "support" section describes, its coefficients zero until `with_tensors` gives the saved
        ones: the base features of the artefact's method in this midlens's order, then any method indicators
        (`fit(by_method=True)`), and the answering methods it was fitted on."""
        base = VERIFIED_FEATURES if artefact.meta["method"] == METHOD_VERIFIED else PLAIN_FEATURES
        features = tuple(section["features"])
        if features[: len(base)] != base or not all(f.startswith(METHOD_FEATURE) for f in features[len(base) :]):
            raise ArtefactError(
                f"support model {artefact.meta_file}: features {section['features']} are not this midlens's "
                f"{list(base)} (then method indicators {METHOD_FEATURE}<spec>).",
                [Step("support-fit", "refit it on train-split runs (training.support.fit_and_save)", {"runs": None})],
            )
        methods = section.get("methods")
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            raise ArtefactError(
                f"support model {artefact.meta_file}: no list of the answering methods it was fitted on (it predates "
                "them, or was edited).",
                [Step("support-fit", "refit it on train-split runs (training.support.fit_and_save)", {"runs": None})],
            )
        zeros = (0.0,) * len(features)
        label, threshold, precision = section["label"], section["threshold"], section["target_precision"]
        return cls(features, zeros, zeros, zeros, 0.0, threshold, precision, label, artefact.path.name, tuple(methods))

    def with_tensors(self, tensors: dict[str, torch.Tensor], artefact: Artefact) -> SupportModel:
        return replace(
            self,
            mean=tuple(tensors["mean"].tolist()),
            scale=tuple(tensors["scale"].tolist()),
            coef=tuple(tensors["coef"].tolist()),
            intercept=float(tensors["intercept"][0]),
        )


def support_method(verified: bool) -> str:
    """The artefact method a support model is saved and loaded under: `SupportModel.load(folder,
    support_method(verified), base_model_sha256)`, the one load every saved part has."""
    return METHOD_VERIFIED if verified else METHOD_PLAIN


def method_indicators(features: tuple[str, ...], method: str | None) -> dict[str, float]:
    """1.0 for the indicator of `method` among `features` (`method=<spec>`), 0.0 for the others."""
    return {f: float(f == f"{METHOD_FEATURE}{method}") for f in features if f.startswith(METHOD_FEATURE)}


def shipped_support_folder(model: str, verified: bool) -> Path:
    return SHIPPED / support_method(verified) / model


def packaged_support(
    model: str, model_sha256: Callable[[], str], verified: bool, method: str | None = None
) -> SupportModel | None:
    """The support model shipped for `model` (a packaged model's name; `model_sha256` gives its content hash, read
    only then), else the model-agnostic one; None when neither ships. A verified one not fitted on `method`'s
    answers (the methods other than the default are fitted without verification) gives way to the plain one that
    is: a calibrated probability without the drops beats an uncalibrated one with them."""
    chosen = _shipped_support(model, model_sha256, verified)
    if verified and method is not None and chosen is not None and method not in chosen.methods:
        plain = _shipped_support(model, model_sha256, False)
        if plain is not None and method in plain.methods:
            return plain
    return chosen


def _shipped_support(model: str, model_sha256: Callable[[], str], verified: bool) -> SupportModel | None:
    own = shipped_support_folder(model, verified)
    if Path(model).name == model and own.is_dir():
        return SupportModel.load(own, support_method(verified), model_sha256())[0]
    generic = shipped_support_folder(GENERIC, verified)
    return SupportModel.load(generic, support_method(verified), GENERIC)[0] if generic.is_dir() else None


def abstain(answer, below: float | None = None) -> bool:
    """Withhold `answer` (generators.answering.answer.Answer) when its support is below `below` (None: its model's
    threshold): its text becomes ABSTAIN_TEXT, and the answer and citations that were withheld move to
    `answer.withheld`. Returns whether it did. An answer without a support score (citations off) is kept: nothing says
    it is unsupported. An answer that restates the question (`Support.answered` False) is withheld whatever its
    probability. `below` becomes the support's threshold in force, so its label and the withholding agree."""
    if answer.support is None or answer.withheld is not None:
        return False
    if below is not None:
        answer.support = answer.support.under(below)
    if answer.support.answered and answer.support.probability >= answer.support.threshold:
        return False
    answer.withheld = {"text": answer.text, "citations": answer.citations}
    answer.text, answer.citations = ABSTAIN_TEXT, []
    return True
