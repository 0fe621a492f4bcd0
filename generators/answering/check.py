"""Which sentences of a checked answer (`Generator.attribute`) may not rest on the passages, and how far it can be
trusted: the checked support model.

An answer this model did not write is read teacher-forced, so the generation-time support model does not apply: its
confidence features are this model's confidence in tokens it picked. The checked support model reads what a forced
pass does mean, per answer sentence (each citation): how probable this reader finds the sentence's tokens after the
passages (mean, lowest, first log-probability, the steps' top-1 minus top-2 margin), the sentence's length, its
attention share on the passage it cites and the margin over the next, whether that passage is the prompt's top
evidence, how many of its words occur in the cited sentence and passage, and how many of the content words it adds
to the question occur in any passage and in the cited one (`new_words`: where a sentence's claim lives, and what an
unsupported clause adds). A logistic regression over them (the generation-time recipe: scikit-learn, standardised
features, C = 1) gives each sentence its own probability of being right; the answer's support is its weakest
sentence's (an answer is right only where every sentence is). Fitted per packaged model on train-split checks read
by the base model (the reader that reads text, not the fine-tune that learned to stop after the entity): the other
packaged model's answers (short, and sentences under `litm`), gold answers and wrong ones (a distractor passage's
entity), bare and in sentences, right sentences with an unsupported clause, and right multi-sentence answers with
one planted false sentence (eval/check_support.py, docs/results/check/README.md), with its own threshold chosen on
those train answers, and shipped as a verified artefact (generators/trained/support-checked/<model>/) that records
the reading it is calibrated for (`methods`: a check read with another method is scored but never "likely"), loaded
like any saved part: `CheckedSupportModel.load(folder, METHOD_CHECKED, base_model_sha256)`. Without one, the
per-sentence verdict is the ablation's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from midlens.core.errors import ArtefactError, InvalidArgumentError
from midlens.core.saved_parts import Artefact
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.citations import Citation, CitedSource
from midlens.generators.answering.support import (
    BY_CALLER,
    LIKELY_FLOOR,
    MARGIN_CLIP,
    TARGET_PRECISION,
    UNLIKELY_BELOW,
    Support,
    SupportModel,
    _word_set,
    choose_threshold,
    shown,
    support_inputs,
)
from midlens.generators.models.shipped import SHIPPED

METHOD_CHECKED = "support-checked"
CHECKED_FEATURES = (
    "mean_logprob",
    "min_logprob",
    "first_logprob",
    "log_tokens",
    "mean_margin",
    "top_share",
    "share_margin",
    "cited_is_top_evidence",
    "evidence_peak",
    "words_in_cited_sentence",
    "words_in_cited_passage",
    "new_words_in_passages",
    "new_words_in_cited_passage",
)
# What the ablation (`verify`) adds per sentence: the largest log-prob drop of its answer tokens without a passage it
# cites, and whether any cited passage verified. Read by the feature study (docs/results/check/report.py), not by the
# shipped model: a check without --verify has none of it.
VERIFY_FEATURES = ("cited_drop", "cited_verified")

NO_SUPPORT_MODEL = (
    "no checked-answer support model ships for this model: the generation-time one reads a model's confidence in "
    "tokens it picked, which a given answer's were not"
)


def verified(answer: Answer) -> bool:
    """Whether the answer's citations were checked by ablation (`Generator.verify`)."""
    return any(s.verified is not None for c in answer.citations for s in c.sources)


def flagged(answer: Answer) -> list[tuple[Citation, str]]:
    """The sentences that may not be supported, each with why: citing no passage; once verified, needing none of the
    passages cited (attention always lands somewhere, so unverified citations flag little); with a checked support
    model, scored in the "check this" band (below UNLIKELY_BELOW): a sentence between that and the likely threshold
    is uncertain, which the answer's support already says, not flagged."""
    check = verified(answer)
    probabilities = sentence_support(answer) or [None] * len(answer.citations)
    floor = UNLIKELY_BELOW
    out = []
    for citation, p in zip(answer.citations, probabilities, strict=True):
        why = []
        if not citation.sources:
            why.append("cites no passage")
        elif check and not any(s.verified for s in citation.sources):
            why.append("needs none of the passages it cites (verified)")
        if p is not None and p < floor:
            why.append(f"support {shown(p, floor)}, below {floor:.2f}")
        if why:
            out.append((citation, "; ".join(why)))
    return out


# What a citation's check says (`citation_check`). A verified passage is one the sentence's tokens need; that backs the
# sentence only where nothing else flags it: a sentence the checked support model scores in the "check this" band
# can need a passage for its wording ("The founder named the chain after her cat." loses 2.4 nats without the
# sentence "Torrid is an American women's retail chain ...", which says nothing of a founder or a cat).
VERIFIED, SHAPES, FAILED, UNCHECKED = "verified", "shapes", "failed", "unchecked"


def doubted(answer: Answer) -> list[bool]:
    """Per sentence (`Answer.citations`), whether it may not rest on the passages: flagged (`flagged`), or, in an
    answer with one support for all its sentences (a generated one), every sentence once that support is in the
    "check this" band; in an answer that restates the question (`Support.answered` False), every sentence."""
    flagged_ = {id(c) for c, _ in flagged(answer)}
    support = answer.support
    whole = support is not None and (
        not support.answered or (not isinstance(support, CheckedSupport) and support.band == "unlikely")
    )
    return [whole or id(c) in flagged_ for c in answer.citations]


def citation_check(source: CitedSource, doubted_: bool) -> str:
    """What one source's check says, its sentence `doubted_` or not (`doubted`): VERIFIED (the sentence needs the
    passage and nothing flags it), SHAPES (it needs the passage, but the sentence may not rest on the passages),
    FAILED (it does not need it) or UNCHECKED."""
    if source.verified is None:
        return UNCHECKED
    if not source.verified:
        return FAILED
    return SHAPES if doubted_ else VERIFIED


def check_words(kind: str, drop: float | None, sentences: list[int]) -> str:
    """A citation's check as the shells print it, in nats: `sentences`, the answer sentences (1-based) it is shown
    for. Empty for UNCHECKED."""
    if kind == UNCHECKED:
        return ""
    lost = "" if drop is None else f": log-prob drop {drop:+.2f} nats without it"
    if kind != SHAPES:
        return ("verified" if kind == VERIFIED else "NOT verified") + lost
    which = f"sentence{'s' if len(sentences) > 1 else ''} {', '.join(map(str, sentences))}"
    they = "those sentences" if len(sentences) > 1 else "that sentence"
    costs = "" if drop is None else f" (log-prob drop {drop:+.2f} nats without it)"
    return f"shapes the wording of {which}{costs}, but {they} may not rest on it"


def unsupported(answer: Answer) -> list[Citation]:
    """The sentences that may not be supported (`flagged`, without the reasons)."""
    return [c for c, _ in flagged(answer)]


def sentence_support(answer: Answer) -> list[float] | None:
    """Each sentence's probability of being right, in `Answer.citations` order, under the checked support model;
    None without one."""
    support = answer.support
    return list(support.sentences) if isinstance(support, CheckedSupport) else None


def support_lines(answer: Answer) -> list[str]:
    """The support as the shells print it: the answer's (its weakest sentence's) and, for several, each sentence's."""
    support = answer.support
    if support is None:
        return [f"support: none ({NO_SUPPORT_MODEL})"]
    lines = [f"support: {support.words}, its weakest sentence's (checked-answer support model of {support.model})"]
    probabilities = sentence_support(answer) or []
    if len(probabilities) > 1:
        edges = (UNLIKELY_BELOW, support.likely_from)
        shown_ = (shown(p, *edges) for p in probabilities)
        lines.append("sentence support: " + "; ".join(f"{i}. {p}" for i, p in enumerate(shown_, 1)))
    return lines


def supported_share(answer: Answer) -> float | None:
    """The share of the answer's sentences that rest on a passage (verified ones once checked); None without
    sentences. A count, not a calibrated probability."""
    if not answer.citations:
        return None
    return 1 - len(unsupported(answer)) / len(answer.citations)


def checked_inputs(answer: Answer) -> dict:
    """`support_inputs` of a checked answer plus each sentence's (citation's) answer tokens and characters, the
    question and every passage's text: what the per-sentence features read. JSON-ready."""
    return {
        **support_inputs(answer),
        "sentence_tokens": [list(c.tokens) for c in answer.citations],
        "sentence_spans": [list(c.span) for c in answer.citations],
        "question": answer.question,
        "passages": [pe.passage.text for pe in answer.passages],
    }


# Words an answer uses to speak of the task, not of the world ("According to the passages, the answer is ...").
TASK_WORDS = frozenset({"answer", "according", "based", "passage", "passages", "document", "documents", "question"})


def new_words(sentence: str, question: str) -> set[str]:
    """The content words a sentence adds to the question: its normalised words less English stop words (scikit-learn's
    list), TASK_WORDS and the question's. An answer's claim lives there: "The answer is Paris." adds only "paris"."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return _word_set(sentence) - ENGLISH_STOP_WORDS - TASK_WORDS - _word_set(question)


def sentence_features(inputs: dict, index: int) -> dict[str, float]:
    """CHECKED_FEATURES and VERIFY_FEATURES of sentence `index` of a checked answer (`checked_inputs`)."""
    a, b = inputs["sentence_tokens"][index]
    lps = inputs["token_logprobs"][a:b]
    margins = (inputs.get("token_margins") or [])[a:b]
    start, end = inputs["sentence_spans"][index]
    words = _word_set(inputs["text"][start:end])
    mine = [s for s in inputs["sources"] if s["sentence_index"] == index]
    top = next((s for s in mine if s["rank"] == 0), None)
    second = next((s["share"] for s in mine if s["rank"] == 1), 0.0)
    evidence = inputs["evidence"]
    total = sum(max(0.0, e) for e in evidence)
    top_evidence = max(range(len(evidence)), key=lambda i: evidence[i]) + 1 if evidence else 0

    def covered(field: str) -> float:
        return len(words & _word_set(top[field] or "")) / len(words) if words and top else 0.0

    if "passages" not in inputs:
        raise InvalidArgumentError(
            "checked inputs without the question and passages (written before midlens recorded them): check the "
            "answers again (eval/check_support.py) to read their features."
        )
    added = new_words(inputs["text"][start:end], inputs["question"])
    everywhere = _word_set(" ".join(inputs["passages"]))
    cited = _word_set(top["passage"] or "") if top else set()
    drops = [s["drop"] for s in mine if s.get("drop") is not None]

    return {
        # A forced token's log-probability: how far this reader, after the passages, would have said it.
        "mean_logprob": sum(lps) / len(lps) if lps else -20.0,
        "min_logprob": min(lps) if lps else -20.0,
        "first_logprob": lps[0] if lps else -20.0,
        "log_tokens": math.log1p(len(lps)),
        "mean_margin": sum(min(MARGIN_CLIP, m) for m in margins) / len(margins) if margins else 0.0,
        "top_share": top["share"] if top else 0.0,
        "share_margin": top["share"] - second if top else 0.0,
        "cited_is_top_evidence": float(top is not None and top["position"] == top_evidence),
        "evidence_peak": max(max(0.0, e) for e in evidence) / total if total > 0 else 0.0,
        "words_in_cited_sentence": covered("sentence"),
        "words_in_cited_passage": covered("passage"),
        # A sentence that adds nothing to the question claims nothing the passages could lack.
        "new_words_in_passages": len(added & everywhere) / len(added) if added else 1.0,
        "new_words_in_cited_passage": len(added & cited) / len(added) if added else 1.0,
        "cited_drop": max(drops) if drops else 0.0,
        "cited_verified": float(any(s.get("verified") for s in mine)),
    }


@dataclass(frozen=True)
class CheckedSupport(Support):
    """A checked answer's support: `probability` is its weakest sentence's; `sentences` holds each sentence's (in
    the order of `Answer.citations`)."""

    sentences: tuple[float, ...] = ()

    @property
    def calibrated(self) -> bool:
        """Whether the reader teacher-forced with the method the checked support model's train rows were read with
        (a model that records none predates the choice and is taken as it is)."""
        return self.method is None or not self.methods or self.method in self.methods

    def under(self, threshold: float) -> CheckedSupport:
        likely = (
            self.answered
            and self.passages_given
            and self.calibrated
            and self.probability >= max(threshold, LIKELY_FLOOR)
        )
        return replace(self, likely=likely, threshold=threshold, threshold_by=BY_CALLER)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "sentences": list(self.sentences),
            "band": self.band,
            "words": self.words,
            "checked": True,
        }


@dataclass(frozen=True)
class CheckedSupportModel(SupportModel):
    """The support model of answers a model did not write: a SupportModel over CHECKED_FEATURES of each sentence."""

    @property
    def verified(self) -> bool:
        return False  # the ablation drops are not read: verification measured no gain at generation time

    @property
    def method(self) -> str:
        return METHOD_CHECKED

    def sentence_probabilities(self, inputs: dict) -> list[float]:
        return [self.probability(sentence_features(inputs, i)) for i in range(len(inputs["sentence_tokens"]))]

    def support(self, inputs: dict, method: str | None = None) -> CheckedSupport | None:
        """None for an answer without sentences to read. `method`: the spec the reader teacher-forced with (None: not
        recorded); features read by another method than the model's train rows were (`methods`) are another
        distribution, so the probability is shown but never "likely"."""
        probabilities = self.sentence_probabilities(inputs)
        if not probabilities:
            return None
        p, threshold = min(probabilities), max(self.threshold, LIKELY_FLOOR)
        given = bool(inputs["evidence"])  # one evidence score per passage given
        calibrated = method is None or not self.methods or method in self.methods
        return CheckedSupport(
            p,
            given and calibrated and p >= threshold,
            threshold,
            False,
            self.name,
            tuple(probabilities),
            methods=self.methods,
            method=method,
            passages_given=given,
        )

    @classmethod
    def fit_checked(
        cls,
        rows: list[dict],
        name: str,
        target_precision: float = TARGET_PRECISION,
        features: tuple[str, ...] = CHECKED_FEATURES,
        methods: tuple[str, ...] = (),
    ) -> CheckedSupportModel:
        """Fit on train-split check rows (`inputs`, `sentence_labels`, `em`): a logistic regression over every
        sentence's `features` (the shipped set unless a feature study asks for another), labelled right or not, and
        the threshold for `target_precision` over the answers' weakest-sentence probabilities (an answer right when
        its `em` is). `methods`: the spec the rows' reader teacher-forced with."""
        import numpy as np

        from midlens.generators.answering.support import standardised_logistic_fit

        x, y = [], []
        for r in rows:
            for i, label in enumerate(r["sentence_labels"]):
                f = sentence_features(r["inputs"], i)
                x.append([f[k] for k in features])
                y.append(label)
        xa, ya = np.asarray(x, dtype=float), np.asarray(y)
        if len(set(ya.tolist())) < 2:
            raise InvalidArgumentError(f"the {len(y)} train sentences are all of one label: no fit.")
        model = cls(
            tuple(features),
            *standardised_logistic_fit(xa, ya),
            0.5,
            target_precision,
            "sentence right (planted: not the planted one; else em)",
            name,
            tuple(methods),
        )
        answers = [r for r in rows if r["sentence_labels"]]
        weakest = [min(model.sentence_probabilities(r["inputs"])) for r in answers]
        right = [int(r["em"] >= 0.5) for r in answers]
        return replace(model, threshold=choose_threshold(weakest, right, target_precision))

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact) -> CheckedSupportModel:
        """The model its "support" section describes, its coefficients zero until `with_tensors` gives the saved
        ones: features among CHECKED_FEATURES (read by name, so a model fitted on fewer still reads right), or
        refused."""
        features = tuple(section["features"])
        unknown = [f for f in features if f not in CHECKED_FEATURES]
        if unknown or len(set(features)) != len(features):
            raise ArtefactError(
                f"checked support model {artefact.meta_file}: features {unknown or list(features)} are not among this "
                f"midlens's {list(CHECKED_FEATURES)}; refit it (docs/results/check/support.py fit)."
            )
        zeros = (0.0,) * len(features)
        label, threshold, precision = section["label"], section["threshold"], section["target_precision"]
        methods = tuple(section.get("methods") or ())  # none recorded: fitted before the reader's method was
        return cls(features, zeros, zeros, zeros, 0.0, threshold, precision, label, artefact.path.name, methods)


def shipped_checked_folder(model: str) -> Path:
    return SHIPPED / METHOD_CHECKED / model


_LOADED: dict[tuple[str, str], CheckedSupportModel] = {}


def packaged_checked_support(model: str, model_sha256: Callable[[], str]) -> CheckedSupportModel | None:
    """The checked support model shipped for `model` (a packaged model's name; `model_sha256` is read only then);
    None for any other model (no model-agnostic one is fitted)."""
    folder = shipped_checked_folder(model)
    if Path(model).name != model or not folder.is_dir():
        return None
    sha = model_sha256()
    if (model, sha) not in _LOADED:
        _LOADED[(model, sha)] = CheckedSupportModel.load(folder, METHOD_CHECKED, sha)[0]
    return _LOADED[(model, sha)]


def checked_support(
    answer: Answer, model_sha256: Callable[[], str], method: str | None = None
) -> CheckedSupport | None:
    """The support of a checked answer, read with `method` (a spec), under the checked support model shipped for its
    model; None without one or without citations."""
    model = packaged_checked_support(answer.model, model_sha256)
    return None if model is None or not answer.citations else model.support(checked_inputs(answer), method)
