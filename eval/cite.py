"""`midlens eval cite`: are the passages (and sentences) an answer cites the ones HotpotQA labels as its support?

Each unit is one question under one method with its answer-bearing supporting paragraph at one prompt position
(the other supporting paragraph sits at a seeded slot among the distractors, the same for every position). The
answer is generated once with citations read permissively (every passage's attention share and its
most-attended sentence, per answer sentence, and the prompt's passage evidence, calibrated and raw), so any
citation rule (`max_sources`, `min_share`, `evidence_weight`, `raw_evidence_weight`: core.citation_rule, as the library
applies it) can be applied afterwards to the same answer: the rule is a report-time choice, tuned on the train
split without regenerating.

On the same answer the row also keeps what the baselines need:
  lexical    BM25 (bm25s) between each answer sentence and every passage sentence; a passage scores its best
             sentence, and the same rule picks passages;
  retrieval  the first passages in prompt order; evidence: the top passages by `PassageEvidence.score`
             (calibrated); evidence_raw: by the raw evidence (all three cite a passage's first sentence at
             sentence level);
  prompted   a separate greedy pass whose instruction asks for [n] markers (LlamaIndex's CitationQueryEngine
             way), parsed from its own text; it has no sentence-level citations.
With `cite_evidence` (a method spec, `CitationConfig.evidence_from`'s), that method also reads each prompt (one
more prefill, as the library runs it) and the row keeps its evidence as `evidence_from`: the rule blends that in
instead of the answering pass's own, and the run grades what `MeasuredCitations(evidence_from=...)` cites.
With `drops`, the answer's tokens are re-scored teacher-forced with the top-k passages of each ranking removed
(batched like `Generator.verify`); with `ablations`, a ContextCite-style linear surrogate is fitted to that many
random half-ablations and its top-k removed too: the reference a cheap attribution is compared with. The `cited`
ranking is the rule's own passage scores (the blend the library cites by), token-weighted over the answer.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from midlens.core.citation_rule import apply_rule, citation_scores
from midlens.core.defaults import DEFAULT_PROMPT_STYLE, EVAL_MODEL
from midlens.core.errors import MidlensError, Remedy
from midlens.core.files import write_atomic
from midlens.generators.attention.positional_attention import new_cache
from midlens.rag.options import AnswerOptions

if TYPE_CHECKING:  # torch loads with these, after the cheap checks
    from midlens.core.passage import Passage
    from midlens.eval.datasets import Example
    from midlens.generators.answering.generator import Generator
    from midlens.generators.attention.evidence import EvidenceConfig

# Rankings whose top-k passages are removed to measure the answer's log-probability drop.
DROP_RANKINGS = ("cited", "midlens", "contextcite", "lexical", "evidence", "evidence_from", "retrieval", "random")
# Citation sources compared against the labels, in table order.
CITERS = ("midlens", "prompted", "lexical", "evidence", "evidence_raw", "evidence_from", "retrieval")
PROMPTED_INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant). After each sentence, cite the search results it uses as [n], "
    "e.g. [1] or [2][5]."
)
# Room for the [n] markers: the prompted answer says as much as the plain one, plus its citations.
PROMPTED_EXTRA_TOKENS = 16
RULE_FILE = "rule.json"  # the citation rule the report applies to a run's rows
# CitationConfig's defaults (not imported: that module loads torch; tests/test_citations.py checks they agree). A
# rule.json without evidence_weight predates it: the answer's attention alone, weight 0; without raw_evidence_weight,
# no raw evidence (rows had none then).
DEFAULT_RULE = {"max_sources": 3, "min_share": 0.7, "evidence_weight": 1.0, "raw_evidence_weight": 0.0}
LASSO_ALPHA = 0.01  # nats; ContextCite's default regularisation for its surrogate


def every_share():
    """The citation setting a run's generators answer with: every passage's share of the answer's attention (no
    evidence blended in: the row keeps the evidence apart) and best sentence, so the rule is applied (and chosen)
    afterwards, by the report."""
    from midlens.generators.answering.citations import CitationConfig

    return CitationConfig(max_sources=64, min_share=0.0, evidence_weight=0.0)


@dataclass(frozen=True)
class CiteOptions:
    """One `eval cite` run. `max_sources`/`min_share`/`evidence_weight`: the citation rule the report applies (rows
    keep every passage's share and the evidence, so a rule is chosen afterwards); None: the rule the library applies
    for this model and method (`run_rule`); `drops`: the k of the top-k
    log-probability drops (empty: none); `ablations`: random ablations of the ContextCite-style reference (0:
    none); `cite_evidence`: the method whose evidence of the prompt the rule blends in (None: the answering
    pass's own)."""

    out: Path
    model: str = EVAL_MODEL
    methods: tuple[str, ...] = ("baseline",)
    device: str = "auto"
    dtype: str = "auto"
    evidence: EvidenceConfig | None = None
    n: int | None = None
    seed: int = 0
    split: str = "eval"
    max_words: int = 100
    positions: tuple[int, ...] = ()
    max_new_tokens: int = 24
    prompt_style: str = DEFAULT_PROMPT_STYLE
    max_sources: int | None = None
    min_share: float | None = None
    evidence_weight: float | None = None
    raw_evidence_weight: float | None = None
    prompted: bool = True
    cite_evidence: str | None = None
    drops: tuple[int, ...] = ()
    ablations: int = 0
    batch_size: int = 1
    shard: tuple[int, int] = (0, 1)  # (i, n): every n-th question from the i-th, as sweeps shard (runner.parse_shard)
    limit: int | None = None
    progress: bool = True


# ---------------------------------------------------------------------------------------------------- metrics


def prf(cited: set[str], gold: set[str]) -> dict[str, float]:
    """Precision, recall and F1 of a citation set. Citing nothing scores 0 on all three: an answer that points
    at no source gives the reader nothing to check."""
    hit = len(cited & gold)
    precision = hit / len(cited) if cited else 0.0
    recall = hit / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def raw_evidence(row: dict) -> list[float]:
    """The row's raw passage evidence (rows made before 2026-11-27 keep the calibrated only)."""
    if "evidence_raw" not in row:
        raise MidlensError(
            f"the row {row.get('key', '?')} has no raw evidence: its run predates rows that keep it.",
            remedies=[Remedy("raw_evidence_weight", 0.0, "for this run, or run `eval cite` again in a new folder")],
        )
    return row["evidence_raw"]


def blended_evidence(row: dict) -> dict:
    """The evidence the rule blends in for this row: the `cite_evidence` method's (`evidence_from`) where the run
    had one, else the answering pass's own (the row itself)."""
    return row.get("evidence_from", row)


def rule_scores(row: dict, sentence: dict, evidence_weight: float, raw_evidence_weight: float) -> list[float]:
    """One answer sentence's citation scores under the rule's weights: what the library cites by."""
    source = blended_evidence(row)
    raw = raw_evidence(source) if raw_evidence_weight else None
    return citation_scores(sentence["attention"], source["evidence"], evidence_weight, raw, raw_evidence_weight)


def cited_sets(
    row: dict,
    citer: str,
    max_sources: int,
    min_share: float,
    evidence_weight: float = 0.0,
    raw_evidence_weight: float = 0.0,
) -> tuple[set[str], set[str] | None]:
    """(cited passage positions, cited sentence labels or None where the citer has no sentences) of one row's
    answer, over all its sentences. Positions are strings, so passage and sentence sets compare alike.
    `evidence_weight` / `raw_evidence_weight` blend the row's calibrated / raw passage evidence (`blended_evidence`)
    into midlens's scores as the library does (lexical scores are BM25's alone); the `evidence` citer ranks by the
    answering pass's calibrated evidence, `evidence_raw` by its raw, `evidence_from` by the `cite_evidence` method's
    raw evidence (the ranking the library blends in, alone)."""
    passages: set[str] = set()
    sentences: set[str] = set()
    if citer == "prompted":
        return {str(p) for p in row["prompted"]["cited"]}, None
    if citer in ("retrieval", "evidence", "evidence_raw", "evidence_from"):
        k = len(row["first_sentence"])
        if citer == "retrieval":
            chosen = list(range(1, min(max_sources, k) + 1))
        else:
            if citer == "evidence":
                scores = row["evidence"]
            elif citer == "evidence_raw":
                scores = raw_evidence(row)
            else:
                scores = row["evidence_from"]["evidence_raw"]
            chosen = [i + 1 for i in sorted(range(k), key=lambda i: -scores[i])[:max_sources]]
        return {str(p) for p in chosen}, {row["first_sentence"][p - 1] for p in chosen}
    key = {"midlens": "attention", "lexical": "lexical"}[citer]
    for sentence in row["sentences"]:
        scores = sentence[key]
        if citer == "midlens":
            scores = rule_scores(row, sentence, evidence_weight, raw_evidence_weight)
        for p in apply_rule(scores, max_sources, min_share):
            passages.add(str(p))
            sentences.add(sentence[key + "_sentence"][p - 1])
    return passages, sentences


def gold_sets(row: dict) -> tuple[set[str], set[str]]:
    return {str(p) for p in row["gold_positions"]}, set(row["gold_sentences"])


def answer_ranking(row: dict, key: str | Callable[[dict], list[float]]) -> list[float]:
    """One score per passage for the whole answer: each sentence's scores (its `key` list, or what `key` makes of
    the sentence) weighted by its tokens."""
    sentences = row["sentences"]
    k = len(row["first_sentence"])
    weight = sum(s["tokens"] for s in sentences) or 1
    per = [s[key] if isinstance(key, str) else key(s) for s in sentences]
    return [sum(s["tokens"] * scores[p] for s, scores in zip(sentences, per, strict=True)) / weight for p in range(k)]


def lasso(masks, targets, alpha: float = LASSO_ALPHA) -> tuple[list[float], float]:
    """(weights, intercept) of `targets ~ masks` under an L1 penalty: ContextCite's surrogate, scikit-learn's Lasso
    (objective 1/(2n) |y - Xw|^2 + alpha |w|_1, intercept fitted)."""
    from sklearn.linear_model import Lasso

    fit = Lasso(alpha=alpha, fit_intercept=True, max_iter=10_000, tol=1e-8).fit(masks, targets)
    return [float(w) for w in fit.coef_], float(fit.intercept_)


# ---------------------------------------------------------------------------------------------------- layout


def layout(example: Example, position: int, seed: int) -> list[Passage]:
    """The example's passages with its answer-bearing supporting paragraph at 1-based `position` (clipped to the
    count) and the other supporting paragraph at a slot drawn per example, the same for every position."""
    bearing = example.gold
    others = [p for p in example.passages if p.id != bearing.id and p.id in example.gold_ids]
    rest = list(example.distractors)
    rng = random.Random(f"{seed}:{example.id}")
    for other in others:
        rest.insert(rng.randrange(len(rest) + 1), other)
    rest.insert(min(position, len(rest) + 1) - 1, bearing)
    return rest


def sentence_label(example: Example, position: int, passage: Passage, chars: tuple[int, int] | None) -> str:
    """A cited sentence as a comparable label: `P#i` for HotpotQA sentence i of the passage at position P when the
    passage is a supporting one (the dataset sentence the span overlaps most), else `P@start`."""
    spans = example.meta.get("sentences", {}).get(passage.id)
    if chars is None:
        return f"{position}@none"
    if spans:
        overlap = [(min(chars[1], e) - max(chars[0], s), i) for s, e, i in spans]
        best, index = max(overlap)
        if best > 0:
            return f"{position}#{index}"
    return f"{position}@{chars[0]}"


def prompted_prompt_ids(tokenizer, passages: list[Passage], question: str) -> list[int]:
    """The prompt of the prompted-citation pass: the evaluation prompt's documents and question under an
    instruction that asks for [n] markers, in the model's chat template."""
    from midlens.generators.models.prompt import render_document

    lines = "".join(render_document(i, p) + "\n" for i, p in enumerate(passages, start=1))
    content = f"{PROMPTED_INSTRUCTION}\n\n{lines}\nQuestion: {question}\nAnswer:"
    messages = [{"role": "user", "content": content}]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        text = content + "\n"
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def greedy(gen: Generator, ids: list[int], max_new_tokens: int) -> str:
    """Greedy decoding of `ids` under the generator's method, without probes (the prompted pass needs only text)."""

    out: list[int] = []
    with gen.running():
        cache = new_cache()
        logits = gen.forward(ids, cache)[-1]
        for _ in range(max_new_tokens):
            token = int(logits.argmax())
            if token in gen.eos_ids:
                break
            out.append(token)
            logits = gen.forward([token], cache)[-1]
    return gen.tokenizer.decode(out, skip_special_tokens=True).strip()


MARKER = re.compile(r"\[(\d+)\]")


def parse_markers(text: str, count: int) -> list[int]:
    """The distinct [n] markers of `text` that name one of `count` passages, in order of first use."""
    found = [int(m) for m in MARKER.findall(text)]
    return list(dict.fromkeys(n for n in found if 1 <= n <= count))


def strip_markers(text: str) -> str:
    return " ".join(MARKER.sub(" ", text).split())


# ---------------------------------------------------------------------------------------------------- evaluator


class CiteEvaluator:
    """Evaluates `eval cite` units: one answer, its citations and baselines, and the optional ablation scores."""

    def __init__(
        self, gens: dict[str, Generator], options: CiteOptions, rule: dict, scorers: dict[str, Generator] | None = None
    ):
        """`rule`: the citation rule the run is graded by (the `cited` drop ranking applies it); `scorers`: per
        method, the generator whose evidence the rule blends in (`cite_evidence`), None for the answering pass's."""
        from midlens.rag.answering import Answering

        for method, gen in gens.items():
            if gen.citations != every_share():
                raise ValueError(f"{method}'s generator cites with {gen.citations}: build it with every_share().")
        self.gens, self.options, self.rule, self.scorers = gens, options, rule, scorers or {}
        # Every answer and ablation score through the one answer path, as every interface answers.
        self.answerings = {method: Answering(gen) for method, gen in gens.items()}

    def __call__(self, example: Example, position: int, method: str, key: str) -> dict:
        from midlens.eval.metrics import best_subspan_em

        o, gen = self.options, self.gens[method]
        t0 = time.perf_counter()
        passages = layout(example, position, o.seed)
        prompt = gen.prompt(example.question, passages, max_new_tokens=o.max_new_tokens, style=o.prompt_style)
        answer = self.answerings[method].answer([prompt], self._answered(o.max_new_tokens, calibrate=True))[0]
        generate_s = time.perf_counter() - t0
        k = len(passages)
        gold_positions = [passages.index(next(p for p in passages if p.id == g)) + 1 for g in example.gold_ids]
        supporting = example.meta["supporting"]
        gold_sentences = [f"{passages.index(p) + 1}#{i}" for p in passages for i in supporting.get(p.id, [])]
        first = [
            sentence_label(example, j, p, s[0].chars if s else None)
            for j, (p, s) in enumerate(zip(passages, prompt.sentences, strict=True), start=1)
        ]
        row = {
            "prediction": answer.text,
            "em": best_subspan_em(answer.text, example.answers),
            "gold_positions": gold_positions,
            "gold_sentences": gold_sentences,
            "first_sentence": first,
            "evidence": [pe.score for pe in answer.passages],
            "evidence_raw": [pe.evidence for pe in answer.passages],
            "sentences": self._sentences(example, prompt, answer),
            "prompt_tokens": answer.prompt_tokens,
            "answer_tokens": len(answer.answer_ids),
            # the generated ids themselves: re-tokenising the text need not give them back, and verifying the
            # answer later (teacher-forced) must score exactly what was generated
            "answer_ids": [int(t) for t in answer.answer_ids],
            "generate_s": generate_s,
        }
        scorer = self.scorers.get(method)
        if scorer is not None:  # a prefill of its own, as the library's citing generator runs it
            t1 = time.perf_counter()
            scored = answer.passages if scorer is gen else scorer.score(prompt).passages
            row["evidence_from"] = {
                "evidence": [pe.score for pe in scored],
                "evidence_raw": [pe.evidence for pe in scored],
                "seconds": time.perf_counter() - t1,
            }
        if o.prompted:
            t1 = time.perf_counter()
            ids = prompted_prompt_ids(gen.tokenizer, passages, example.question)
            text = greedy(gen, ids, o.max_new_tokens + PROMPTED_EXTRA_TOKENS)
            row["prompted"] = {
                "text": text,
                "em": best_subspan_em(strip_markers(text), example.answers),
                "cited": parse_markers(text, k),
                "seconds": time.perf_counter() - t1,
            }
        if (o.drops or o.ablations) and answer.answer_ids:
            t1 = time.perf_counter()
            row.update(self._ablations(method, example, passages, answer.answer_ids, row, key))
            row["ablation_s"] = time.perf_counter() - t1
        row["seconds"] = time.perf_counter() - t0
        return row

    def _sentences(self, example: Example, prompt, answer) -> list[dict]:
        """Per answer sentence: every passage's attention share and lexical score, and the sentence each would cite."""
        from midlens.core.passage import Passage
        from midlens.retrievers.lexical import BM25Index

        passages = prompt.passages
        k = len(passages)
        units = [(p, s) for p in range(k) for s in prompt.sentences[p]]
        texts = [passages[p].text[s.chars[0] : s.chars[1]] for p, s in units]
        index = BM25Index([Passage(text=t) for t in texts]) if units else None
        out = []
        for citation in answer.citations:
            attention = [0.0] * k
            attention_sentence = [f"{p + 1}@none" for p in range(k)]
            for source in citation.sources:
                p = source.position - 1
                attention[p] = source.score
                attention_sentence[p] = sentence_label(example, source.position, passages[p], source.sentence)
            lexical = [0.0] * k
            lexical_sentence = [f"{p + 1}@none" for p in range(k)]
            if index is not None:
                scores = index.scores(answer.text[citation.span[0] : citation.span[1]])
                for (p, s), score in zip(units, scores, strict=True):
                    if score > lexical[p]:
                        lexical[p] = float(score)
                        lexical_sentence[p] = sentence_label(example, p + 1, passages[p], s.chars)
            total = sum(lexical)
            out.append(
                {
                    "span": list(citation.span),
                    "tokens": citation.tokens[1] - citation.tokens[0],
                    "attention": attention,
                    "attention_sentence": attention_sentence,
                    "lexical": [x / total for x in lexical] if total > 0 else lexical,
                    "lexical_sentence": lexical_sentence,
                }
            )
        return out

    def _ablations(
        self, method: str, example: Example, passages: list[Passage], ids: list[int], row: dict, key: str
    ) -> dict:
        """Log-probability of the same answer tokens with passages removed: the top-k of each ranking, and the
        random ablations of the ContextCite-style surrogate, scored in one batched pass list."""
        import numpy as np

        o = self.options
        k = len(passages)
        seed = int(hashlib.sha256(f"{o.seed}:{key}".encode()).hexdigest()[:8], 16)
        rng = np.random.default_rng(seed)
        masks = [tuple(bool(x) for x in rng.random(k) < 0.5) for _ in range(o.ablations)]
        rule = self.rule
        rankings = {
            "cited": answer_ranking(
                row, lambda s: rule_scores(row, s, rule["evidence_weight"], rule["raw_evidence_weight"])
            ),
            "midlens": answer_ranking(row, "attention"),
            "lexical": answer_ranking(row, "lexical"),
            "evidence": list(row["evidence"]),
            "retrieval": [-float(p) for p in range(k)],
            "random": list(rng.random(k)),
        }
        if "evidence_from" in row:
            rankings["evidence_from"] = list(row["evidence_from"]["evidence_raw"])
        removed = {name: self._top(scores, o.drops) for name, scores in rankings.items()}
        wanted: dict[frozenset, None] = {frozenset(): None}
        for mask in masks:
            wanted[frozenset(p for p in range(k) if not mask[p])] = None
        for sets in removed.values():
            wanted.update(dict.fromkeys(sets.values()))
        scores = self._score(method, example, passages, ids, list(wanted))
        full = scores[frozenset()]
        drops = {name: {str(j): full - scores[s] for j, s in sets.items()} for name, sets in removed.items()}
        out: dict = {"full_logprob": full, "drops": drops}
        if masks:
            weights, intercept = lasso(masks, [scores[frozenset(p for p in range(k) if not m[p])] for m in masks])
            top = self._top(list(weights), o.drops)
            extra = [s for s in top.values() if s not in scores]
            scores.update(self._score(method, example, passages, ids, extra))
            drops["contextcite"] = {str(j): full - scores[s] for j, s in top.items()}
            out["contextcite"] = {"weights": [float(w) for w in weights], "intercept": intercept}
            rankings["contextcite"] = list(weights)
        out["top"] = {name: [p + 1 for p in sorted(range(k), key=lambda i: -r[i])[:3]] for name, r in rankings.items()}
        return out

    @staticmethod
    def _top(scores: list[float], ks: Sequence[int]) -> dict[int, frozenset]:
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return {j: frozenset(order[:j]) for j in ks}

    @staticmethod
    def _answered(max_new_tokens: int, calibrate: bool) -> AnswerOptions:
        """The answer path's options for this run: greedy, the prompt as stacked (no restack), no line-end stop."""
        return AnswerOptions(max_new_tokens=max_new_tokens, calibrate=calibrate, stop_at_line_end=False, restack=None)

    def _score(self, method, example, passages, ids, removed_sets) -> dict[frozenset, float]:
        o, gen = self.options, self.gens[method]
        prompts = [
            gen.prompt(
                example.question,
                [p for j, p in enumerate(passages) if j not in removed],
                max_new_tokens=o.max_new_tokens,
                style=o.prompt_style,
            )
            for removed in removed_sets
        ]
        refs = [list(ids)] * len(prompts)
        answers = self.answerings[method].answer(prompts, self._answered(0, False), o.batch_size, references=refs)
        return {s: float(sum(a.reference_token_logprobs)) for s, a in zip(removed_sets, answers, strict=True)}


# ---------------------------------------------------------------------------------------------------- the run


def plan(options: CiteOptions) -> tuple[dict, list[dict], list]:
    """The run's config and units, and the examples they index; no model is loaded. One function on purpose: the
    config is one record whose every field is decided here, in the order it is written."""
    from dataclasses import asdict

    from midlens.core.device import dtype_name, resolve_device, resolve_dtype
    from midlens.core.files import sha256_json
    from midlens.core.method_spec import check_cite_evidence, parse_known_specs
    from midlens.eval.datasets import data_sha256, load_hotpotqa
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.model_cache import content_sha256
    from midlens.generators.models.packaged_models import canonical_name

    parsed = parse_known_specs(list(options.methods))
    configs = {spec: method_config(name, opts).to_dict() for spec, (name, opts) in parsed.items()}
    max_words = None if options.max_words <= 0 else options.max_words
    examples = load_hotpotqa(options.n, options.seed, mode="cite", max_words=max_words, split=options.split)
    name = "hotpotqa" if options.split == "eval" else f"hotpotqa-{options.split}"
    k = max(len(ex.passages) for ex in examples) if examples else 10
    positions = list(options.positions) or sorted({1, max(1, k // 2), k})
    device = resolve_device(options.device)
    model = canonical_name(options.model)
    config = {
        "kind": "cite",
        "model": model,
        "model_sha256": content_sha256(model),
        "device": str(device),
        "dtype": dtype_name(resolve_dtype(options.dtype, device)),
        "methods": {m: {**c, "ordering": None} for m, c in configs.items()},
        "evidence": asdict(options.evidence or EvidenceConfig()),
        "seed": options.seed,
        "n": options.n,
        "max_new_tokens": options.max_new_tokens,
        "prompt_style": options.prompt_style,
        "max_words": options.max_words,
        "dataset": name,
        "data_sha256": data_sha256(examples),
        "examples": len(examples),
        "k": k,
        "positions": positions,
        "prompted": options.prompted,
        "drops": list(options.drops),
        "ablations": options.ablations,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if check_cite_evidence(options.cite_evidence) is not None:  # only when given: runs without it keep their config
        config["cite_evidence"] = {"spec": options.cite_evidence, **method_config(options.cite_evidence).to_dict()}
    config["methods_sha256"] = {m: sha256_json(c) for m, c in config["methods"].items()}
    per = len(configs) * len(positions)
    units = [
        {
            "key": f"{ex.id}|{m}|{p}",
            "order": i * per + j * len(positions) + q,
            "example": i,
            "example_id": ex.id,
            "kind": "cite",
            "dataset": name,
            "k": k,
            "method": m,
            "position": p,
        }
        for i, ex in enumerate(examples)
        for j, m in enumerate(configs)
        for q, p in enumerate(positions)
    ]
    config["units"] = len(units)
    return config, units, examples


def run_rule(options: CiteOptions, methods: list[str]) -> dict:
    """The rule the report applies: each value given in `options`, the others from the rule `Generator` cites by for
    this model and the run's methods (generators.answering.citations.MEASURED_RULES, when they all share one;
    DEFAULT_RULE otherwise), so a run grades what the library would cite."""
    from midlens.generators.answering.citations import CitationConfig
    from midlens.generators.models.packaged_models import canonical_name

    model = canonical_name(options.model)
    # the lookup MeasuredCitations makes for Generator(citations=)
    configs = [CitationConfig.measured(model, spec, options.cite_evidence) for spec in methods]
    measured = [{k: getattr(c, k) for k in DEFAULT_RULE} for c in configs]
    base = measured[0] if measured and all(r == measured[0] for r in measured) else DEFAULT_RULE
    given = {k: getattr(options, k) for k in DEFAULT_RULE if getattr(options, k) is not None}
    return {**base, **given}


def run(options: CiteOptions) -> list[dict]:
    """Evaluate the run's units not yet in its results file (resumable: one appended line per unit)."""
    from midlens.eval import runner
    from midlens.generators.answering.generator import Generator
    from midlens.generators.methods.registry import method_config
    from midlens.generators.models.loading import load_model

    config, units, examples = plan(options)
    from midlens.eval.datasets import data_sha256

    def prefix_sha256(count: int) -> str:
        return data_sha256(examples[:count])

    results, _, _, todo = runner.pending_units(options.out, config, units, options.shard, options.limit, prefix_sha256)
    # Rows keep every passage's share, so the rule is not part of the run: it is read by the report, and a later
    # `eval cite` on the same folder with another rule changes only this file.
    rule = run_rule(options, config["methods"])
    write_atomic(Path(options.out) / RULE_FILE, json.dumps(rule, indent=2) + "\n")
    if not todo:
        return runner.read_rows(results)
    loaded = load_model(options.model, options.device, options.dtype)
    gens = {
        m: Generator(loaded, method=m, evidence=options.evidence, citations=every_share()) for m in config["methods"]
    }
    scorers = None
    if options.cite_evidence is not None:
        scorer_config = method_config(options.cite_evidence)
        scorers = {m: gen.scorer(scorer_config) for m, gen in gens.items()}
    evaluator = CiteEvaluator(gens, options, rule, scorers)

    def evaluate(unit: dict) -> dict:
        return evaluator(examples[unit["example"]], unit["position"], unit["method"], unit["key"])

    return runner.run_units(
        options.out, config, units, evaluate, options.shard, limit=options.limit, progress=options.progress
    )
