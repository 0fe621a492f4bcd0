"""Answers midlens did not write, checked by a packaged model: the rows the checked support model is fitted on (train
splits) and measured on (held-out splits).

Each unit is one question with its gold passage at one slot (1 / 3 / 5 of 5, rotating over the questions) and one
answer to check, teacher-forced by `Pipeline.check` over the passages as given (never restacked):
  other    the other packaged model's answer to the same question at the same slot (docs/results/support rows);
  own      the reader's own answer there (held out only: the "same model" row);
  gemma    Gemma 3 270M's answer (its HotpotQA sweep rows, baseline method; the prompt rebuilt from the same question
           and passages as Gemma read them: 100 words each);
  gold     the gold answer;
  wrong    an entity of a distractor passage of the same kind as the gold answer (a number for a number, a name for a
           name, the other of yes/no, another UUID for KV): a fluent, plausible, unsupported answer;
  planted  a right multi-sentence answer (up to three sentences of the gold passage, around the one holding the gold
           answer) with one entity of one sentence swapped for one of a distractor passage (HotpotQA and SQuAD).
A row keeps the checked answer's `generators.answering.check.checked_inputs` and its labels (EM for model answers; for
`planted`, which sentence was planted), so the checked support model is fitted and re-measured without the language
model. Resumable, one row per unit (eval.runner).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path

from midlens.core.answer_text import normalize_answer
from midlens.core.errors import InvalidArgumentError

SUPPORT_RUNS = Path(__file__).resolve().parent.parent / "docs" / "results" / "support" / "runs"
GEMMA_RUNS = Path(__file__).resolve().parent.parent / "docs" / "results" / "gemma3-270m" / "runs"
FOLDERS = {"smollm2-135m": "smol", "qwen2.5-coder-0.5b": "qwen"}  # the support runs' folder per packaged model
KINDS = ("other", "own", "gemma", "gold", "wrong", "planted")
TRAIN_KINDS = ("other", "gold", "wrong", "planted")  # never the reader's own answers: those are the held-out row
GEMMA_MAX_WORDS = 100  # the Gemma sweep's passages (docs/results/gemma3-270m/runs/hotpotqa/config.json)
POSITIONS = (1, 3, 5)  # the gold passage's slot among K = 5: first, middle, last
# The support runs' questions (K = 10 candidates: their KV examples are ten pairs) and the slot of theirs whose answer
# is checked at each of ours (first, middle, last).
SUPPORT_K = 10
SOURCE_SLOT = {1: 1, 3: 5, 5: 10}

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_NUMBER = re.compile(r"\b\d[\d,.]*\d\b|\b\d\b")
# A run of capitalised words (allowing "of", "the", "de" inside): what a name, a title or a place looks like.
_NAME = re.compile(r"\b[A-Z][\w'\-]+(?:\s+(?:of|the|de|von|van|and)?\s*[A-Z][\w'\-]+)*")


@dataclass(frozen=True)
class CheckRunOptions:
    out: Path
    reader: str = "smollm2-135m"
    dataset: str = "hotpotqa"
    split: str = "eval"
    n: int = 40
    kinds: tuple[str, ...] = ("other", "own", "gemma", "planted")
    # Five passages, not the support runs' ten: a teacher-forced pass is the prompt's prefill, and on the shared 2-core
    # CPU these runs had, ten passages cost 45 s a pass (the models are applied to any K; README, "Not done").
    k: int = 5
    max_words: int = 60
    dtype: str = "bfloat16"  # the support runs' (docs/results/support: bf16, one thread)
    seed: int = 0
    limit: int | None = None
    progress: bool = True


def _rows_by_key(folder: Path) -> dict[str, dict]:
    rows = {}
    for f in sorted(folder.glob("results*.jsonl*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    row = json.loads(line)
                    rows[row["key"]] = row
    return rows


def model_answers(model: str, dataset: str, split: str) -> dict[str, dict]:
    """`example_id|slot` -> the packaged model's support-run row (prediction, em) on that corpus and split."""
    name = dataset if split == "eval" else f"{dataset}-{split}"
    folder = SUPPORT_RUNS / FOLDERS[model] / name
    if not folder.is_dir():
        raise InvalidArgumentError(f"{folder}: no support run of {model} on {name}; run `midlens eval support` first.")
    return _rows_by_key(folder)


def gemma_answers() -> dict[str, dict]:
    """`example_id|slot` -> Gemma 3's baseline answer in its HotpotQA (eval split) sweep."""
    rows = _rows_by_key(GEMMA_RUNS / "hotpotqa")
    return {f"{r['example_id']}|{r['position']}": r for r in rows.values() if r["method"] == "baseline"}


def _candidates(text: str, gold: str) -> list[str]:
    """Entities of `text` of the kind `gold` is (UUID, number, name)."""
    if _UUID.fullmatch(gold):
        return _UUID.findall(text)
    if _NUMBER.fullmatch(gold.replace(" ", "")) or re.fullmatch(r"\d[\d,.\s]*", gold):
        return _NUMBER.findall(text)
    return [m.group(0) for m in _NAME.finditer(text) if m.start() > 0]


def distractor_entity(example, gold: str, rng: random.Random, avoid: str = "") -> str | None:
    """An entity of a distractor passage of `gold`'s kind that neither the gold answers nor `avoid` (the gold
    passage's text) contain: a plausible answer the passages do not support."""
    if normalize_answer(gold) in ("yes", "no"):
        return "no" if normalize_answer(gold) == "yes" else "yes"
    taken = {normalize_answer(a) for a in example.answers}
    avoid_norm = normalize_answer(avoid)
    pool = []
    for passage in example.distractors:
        for entity in _candidates(passage.text, gold):
            norm = normalize_answer(entity)
            if norm and norm not in taken and norm not in avoid_norm and not any(t in norm for t in taken if t):
                pool.append(entity)
    return rng.choice(sorted(set(pool))) if pool else None


def planted_answer(example, rng: random.Random) -> tuple[str, tuple[int, int], list[tuple[int, int]]] | None:
    """A right answer of two or three gold-passage sentences (around the one holding the gold answer) with one
    entity of one of them swapped for a distractor passage's: (text, the planted sentence's characters, every
    sentence's characters). None when the gold passage has fewer than two sentences or nothing to swap."""
    from midlens.core.sentences import sentence_spans

    text = example.gold.text
    spans = [s for s in sentence_spans(text) if len(text[s[0] : s[1]].split()) >= 4]
    if len(spans) < 2:
        return None
    gold = normalize_answer(example.answers[0])
    holding = next((i for i, (a, b) in enumerate(spans) if gold and gold in normalize_answer(text[a:b])), 0)
    start = max(0, min(holding - 1, len(spans) - 3))
    chosen = [text[a:b].strip() for a, b in spans[start : start + 3]]
    order = list(range(len(chosen)))
    rng.shuffle(order)
    for victim in order:
        sentence = chosen[victim]
        entities = [m for m in _NAME.finditer(sentence) if m.start() > 0] + list(_NUMBER.finditer(sentence))
        rng.shuffle(entities)
        for match in entities:
            swap = distractor_entity(example, match.group(0), rng, avoid=text)
            if swap is None or normalize_answer(swap) == normalize_answer(match.group(0)):
                continue
            chosen[victim] = sentence[: match.start()] + swap + sentence[match.end() :]
            out, char_spans = "", []
            for s in chosen:
                out += (" " if out else "") + s
                char_spans.append((len(out) - len(s), len(out)))
            return out, char_spans[victim], char_spans
    return None


def _slot(index: int) -> int:
    return POSITIONS[index % len(POSITIONS)]


def load_examples(options: CheckRunOptions, max_words: int):
    from midlens.eval.support import SupportRunOptions
    from midlens.eval.support import load_examples as support_examples

    return support_examples(
        SupportRunOptions(Path("."), options.dataset, options.split, n=options.n, k=SUPPORT_K, max_words=max_words)
    )


def plan(options: CheckRunOptions) -> tuple[dict, list[dict], tuple[list, list | None]]:
    """The run's config, its units (each holding the answer to check and its labels) and the examples they index
    (and, for Gemma's answers, the same examples with Gemma's passage length); no model is loaded."""
    from midlens.eval.datasets import data_sha256

    if options.split == "train" and set(options.kinds) - set(TRAIN_KINDS):
        raise InvalidArgumentError(f"train runs check {TRAIN_KINDS} answers only, not {options.kinds}.")
    examples = load_examples(options, options.max_words)
    other = next(m for m in FOLDERS if m != options.reader)
    answers = {kind: {} for kind in options.kinds}
    if "other" in options.kinds:
        answers["other"] = model_answers(other, options.dataset, options.split)
    if "own" in options.kinds:
        answers["own"] = model_answers(options.reader, options.dataset, options.split)
    gemma_examples = None
    if "gemma" in options.kinds and options.dataset == "hotpotqa" and options.split == "eval":
        answers["gemma"] = gemma_answers()
        gemma_examples = load_examples(options, GEMMA_MAX_WORDS)
    units = []
    for i, ex in enumerate(examples):
        slot = _slot(i)
        rng = random.Random(f"{options.seed}|{ex.id}")
        for kind in options.kinds:
            unit = {"example": i, "example_id": ex.id, "position": slot, "kind": kind, "dataset": options.dataset}
            key = f"{ex.id}|{slot}"
            if kind in ("other", "own", "gemma"):
                row = answers[kind].get(f"{ex.id}|{SOURCE_SLOT[slot]}")
                if row is None or not row["prediction"].strip():
                    continue
                unit.update(answer=row["prediction"], em=float(row["em"]), source=other if kind == "other" else kind)
                if kind == "gemma":
                    unit["max_words"] = GEMMA_MAX_WORDS
                    assert gemma_examples[i].id == ex.id
            elif kind == "gold":
                unit.update(answer=ex.answers[0], em=1.0)
            elif kind == "wrong":
                entity = distractor_entity(ex, ex.answers[0], rng, avoid=ex.gold.text)
                if entity is None:
                    continue
                unit.update(answer=entity, em=0.0)
            elif kind == "planted":
                made = planted_answer(ex, rng)
                if made is None:
                    continue
                text, planted, spans = made
                unit.update(answer=text, em=0.0, planted=list(planted), sentences=[list(s) for s in spans])
            units.append({"key": f"{key}|{kind}", "order": len(units), **unit})
    config = {
        "kind": "check-support",
        "reader": options.reader,
        "dataset": options.dataset if options.split == "eval" else f"{options.dataset}-{options.split}",
        "split": options.split,
        "data_sha256": data_sha256(examples),
        "examples": len(examples),
        "n": options.n,
        "k": options.k,
        "max_words": options.max_words,
        "kinds": list(options.kinds),
        "dtype": options.dtype,
        "seed": options.seed,
        "units": len(units),
    }
    return config, units, (examples, gemma_examples)


def sentence_labels(inputs: dict, unit: dict) -> list[int]:
    """Per checked sentence (citation), 1 when it is right: for a planted answer, every sentence but the one
    overlapping the planted characters; otherwise the answer's own label."""
    spans = inputs["sentence_spans"]
    if unit["kind"] != "planted":
        return [int(unit["em"] >= 0.5)] * len(spans)
    a, b = unit["planted"]
    return [int(not (s < b and a < e)) for s, e in spans]


def run(options: CheckRunOptions) -> list[dict]:
    import torch

    from midlens.eval import runner
    from midlens.eval.sweep import layout
    from midlens.generators.answering.check import checked_inputs
    from midlens.generators.answering.generator import Generator
    from midlens.generators.models.loading import load_model
    from midlens.generators.models.packaged_models import default_method
    from midlens.rag.pipeline import Pipeline

    torch.set_num_threads(max(1, torch.get_num_threads()))
    config, units, (examples, gemma_examples) = plan(options)
    from midlens.eval.datasets import data_sha256

    def prefix_sha256(count: int) -> str:  # a run grows with a larger --n (the same first questions)
        return data_sha256(examples[:count])

    _, _, _, todo = runner.pending_units(options.out, config, units, (0, 1), options.limit, prefix_sha256)
    if not todo:
        return runner.read_rows(Path(options.out) / runner.results_name((0, 1)))
    loaded = load_model(options.reader, "cpu", options.dtype)
    pipe = Pipeline(None, Generator(loaded, method=default_method(loaded.name)))

    def evaluate(unit: dict) -> dict:
        source = gemma_examples if unit.get("max_words") == GEMMA_MAX_WORDS else examples
        example = source[unit["example"]]
        t0 = time.perf_counter()
        answer = pipe.check(example.question, unit["answer"], layout(example, options.k, unit["position"]))
        inputs = checked_inputs(answer)
        return {
            "inputs": inputs,
            "sentence_labels": sentence_labels(inputs, unit),
            "prompt_tokens": answer.prompt_tokens,
            "seconds": time.perf_counter() - t0,
        }

    return runner.run_units(
        options.out, config, units, evaluate, (0, 1), options.limit, options.progress, prefix_sha256=prefix_sha256
    )


def read_check_run(folder: Path) -> tuple[dict, list[dict]]:
    """The config and rows of a check-support run."""
    from midlens.eval import runner

    config_file = Path(folder) / runner.CONFIG
    if not config_file.is_file():
        raise InvalidArgumentError(f"{folder}: no {runner.CONFIG}; pass a folder eval.check_support.run wrote.")
    config = json.loads(config_file.read_text())
    if config.get("kind") != "check-support":
        raise InvalidArgumentError(f"{folder}: a {config.get('kind')!r} run, not a check-support run.")
    return config, [r for f in sorted(Path(folder).glob("results*.jsonl*")) for r in runner.read_rows(f)]


def fit_and_save(runs: list[Path], out: Path | None = None) -> Path:
    """Fit the checked support model of one reader on its train-split check runs and save it as an artefact (default:
    the shipped folder, generators/trained/support-checked/<reader>/)."""
    from midlens.generators.answering.check import CheckedSupportModel, shipped_checked_folder
    from midlens.generators.answering.support import C
    from midlens.generators.models.model_cache import content_sha256

    loaded = [read_check_run(r) for r in runs]
    held_out = [str(r) for r, (c, _) in zip(runs, loaded, strict=True) if c["split"] != "train"]
    if held_out:
        raise InvalidArgumentError(f"{', '.join(held_out)}: held-out runs; fit on train-split runs only.")
    readers = sorted({c["reader"] for c, _ in loaded})
    if len(readers) != 1:
        raise InvalidArgumentError(f"runs of several readers ({', '.join(readers)}): fit one reader's at a time.")
    reader = readers[0]
    rows = [r for _, rs in loaded for r in rs if r["sentence_labels"]]
    model = CheckedSupportModel.fit_checked(rows, reader)
    sentences = [label for r in rows for label in r["sentence_labels"]]
    training = {
        "estimator": f"sklearn LogisticRegression(C={C}) on standardised per-sentence features",
        "label": model.label,
        "threshold": f"lowest weakest-sentence probability whose train answers are right >= {model.target_precision}",
        "answers": len(rows),
        "right": sum(int(r["em"] >= 0.5) for r in rows),
        "sentences": len(sentences),
        "sentences_right": sum(sentences),
    }
    data = {
        "answers": len(rows),
        "runs": [
            {
                "dataset": c["dataset"],
                "reader": c["reader"],
                "kinds": c["kinds"],
                "answers": len(rs),
                "data_sha256": c["data_sha256"],
                "n": c["n"],
                "seed": c["seed"],
                "dtype": c["dtype"],
            }
            for c, rs in loaded
        ],
    }
    meta = {"method": model.method, "base_model": reader, "base_model_sha256": content_sha256(reader), "options": {}}
    return model.save(out or shipped_checked_folder(reader), {**meta, "training": training, "data": data})
