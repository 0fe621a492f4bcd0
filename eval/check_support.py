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
           answer) with one entity of one sentence swapped for one of a distractor passage (HotpotQA and SQuAD);
  gold-sentence   the gold answer in a sentence, as a RAG answer under the `litm` instruction reads: the question
           turned into a statement where its form allows ("who wrote X" -> "Y wrote X."), else one of a few
           answer frames ("According to the passages, the answer is Y.");
  wrong-sentence  the same with the `wrong` entity;
  clause   the gold sentence with an unsupported clause naming a distractor passage's entity ("..., according to
           Z."): right answer, unsupported claim, labelled wrong;
  added    a right sentence answer and an unsupported sentence of no passage's wording ("Z was also involved."),
           in either order: the planted false sentence of a paraphrase, not of a copied passage (held out);
  sweep    the answers of an `eval sweep` run (`CheckRunOptions.answers`: another model's, under its instruction),
           read over the very prompt they were written on (its K, passage length and gold slot), labelled by the
           sweep's substring EM.
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
SENTENCE_KINDS = ("gold-sentence", "wrong-sentence", "clause")
KINDS = ("other", "own", "gemma", "gold", "wrong", "planted", *SENTENCE_KINDS, "added", "sweep")
# Never the reader's own answers: those are the held-out row. Short answers and sentences about half and half, the
# way RAG answers come (an instruct model's under `litm` are sentences, a fine-tune's or an extractor's short).
TRAIN_KINDS = ("other", "gold", "wrong", "planted", *SENTENCE_KINDS)
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
    # The method the reader teacher-forces with: the base model reads a sentence as text, a fine-tune that learned
    # to stop after the entity charges every word after it (README, "Reader").
    reader_method: str = "baseline"
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
    # Each cited passage checked by ablation (`CheckOptions.verify`): VERIFY_FEATURES, one prefill per cited passage.
    verify: bool = False
    # kind "sweep": `eval sweep` run folders whose `answer_methods` rows are checked, the first `answers_n` questions
    # of each; `answers_data`, the dataset file a sweep over a JSONL file read (its config names only the file).
    answers: tuple[Path, ...] = ()
    answer_methods: tuple[str, ...] = ("baseline",)
    answers_n: int = 40
    answers_data: Path | None = None
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


# Answer frames an instruct model's sentence answers take; {a} is the answer.
FRAMES = (
    "The answer is {a}.",
    "According to the passages, the answer is {a}.",
    "Based on the documents, it is {a}.",
    "{a} is the answer to the question.",
    "It was {a}.",
)
# Unsupported additions: each names an entity of a distractor passage in a relation no passage states.
CLAUSES = (", according to {x}.", ", together with {x}.", ", as {x} later confirmed.", ", shortly after {x}.")
_AUX = r"is|was|are|were"
_NOT_SUBJECT_VERBS = {"did", "does", "do", "is", "was", "are", "were", "has", "have", "had", "can", "will", "would"}


def statement(question: str, answer: str) -> str | None:
    """The question turned into a statement holding `answer`, where its form allows: "who wrote X?" -> "A wrote X.",
    "what is the capital of X?" -> "The capital of X is A."; None otherwise."""
    q = question.strip().rstrip("?").strip()
    m = re.match(rf"(?i)^(?:who|what|which(?: \w+)?)\s+({_AUX})\s+(.+)$", q)
    if m:
        rest = m.group(2)
        return f"{rest[0].upper()}{rest[1:]} {m.group(1).lower()} {answer}."
    m = re.match(r"(?i)^(?:who|what(?: \w+)?|which(?: \w+)?)\s+(\w+)\s+(.+)$", q)
    if m and m.group(1).lower() not in _NOT_SUBJECT_VERBS:
        return f"{answer} {m.group(1)} {m.group(2)}."
    return None


def sentence_answer(question: str, answer: str, rng: random.Random) -> str:
    """`answer` in one sentence: the question as a statement (`statement`) half the time it has one, else a frame."""
    made = statement(question, answer)
    if made is not None and rng.random() < 0.5:
        return made
    return rng.choice(FRAMES).format(a=answer)


def clause_answer(example, rng: random.Random) -> str | None:
    """The gold answer's sentence with an unsupported clause naming a distractor passage's name (else an entity of
    the gold answer's kind: a KV pair's UUID); None when the distractors hold neither."""
    entity = distractor_entity(example, "Placeholder Name", rng, avoid=example.gold.text)
    if entity is None:
        entity = distractor_entity(example, example.answers[0], rng, avoid=example.gold.text)
    if entity is None or normalize_answer(entity) in ("yes", "no"):
        return None
    sentence = sentence_answer(example.question, example.answers[0], rng)
    return sentence[:-1] + rng.choice(CLAUSES).format(x=entity)


# Unsupported sentences an answer may add; {x} is a distractor passage's entity.
ADDED = ("This was later confirmed by {x}.", "{x} was also involved.", "It happened shortly after {x}.")


def added_answer(example, rng: random.Random) -> tuple[str, tuple[int, int], list[tuple[int, int]]] | None:
    """A right sentence answer (`sentence_answer`) and an unsupported sentence naming a distractor passage's entity,
    in random order: (text, the unsupported sentence's characters, both sentences' characters); None without an
    entity."""
    entity = distractor_entity(example, "Placeholder Name", rng, avoid=example.gold.text)
    if entity is None:
        return None
    right = sentence_answer(example.question, example.answers[0], rng)
    wrong = rng.choice(ADDED).format(x=entity)
    first, second = (wrong, right) if rng.random() < 0.5 else (right, wrong)
    spans = [(0, len(first)), (len(first) + 1, len(first) + 1 + len(second))]
    return f"{first} {second}", spans[0 if first is wrong else 1], spans


def sweep_examples(config: dict, data: Path | None = None) -> list:
    """The examples an `eval sweep` run (`config`) read, rebuilt and checked against its recorded data hash."""
    from midlens.eval.datasets import data_sha256
    from midlens.eval.options import RunOptions
    from midlens.eval.plan import examples_of

    name = config["dataset"]
    if name.startswith("hotpotqa"):
        dataset, split = "hotpotqa", ("train" if name.endswith("-train") else "eval")
    elif name.startswith("squad-v2-dev"):
        dataset, split = "squad", {"squad-v2-dev": None}.get(name, name.rsplit("-", 1)[-1])
    elif data is not None:
        dataset, split = str(data), None
    else:
        raise InvalidArgumentError(
            f"the sweep read {name}, a file: pass its path (--answers-data) so its examples can be rebuilt."
        )
    options = RunOptions(
        mode="sweep",
        out=Path("."),
        dataset=dataset,
        split=split,
        n=config["n"],
        seed=config["seed"],
        k=config["k"],
        max_words=config["max_words"],
    )
    examples = examples_of(options)[1]
    if data_sha256(examples) != config["data_sha256"]:
        raise InvalidArgumentError(
            f"the examples rebuilt for the sweep over {name} do not hash to its recorded data_sha256: pass the "
            "dataset file as that run was given it (the path, relative to where it ran)."
        )
    return examples


def sweep_units(options: CheckRunOptions) -> tuple[list[dict], list[list]]:
    """Units of kind "sweep" (without key and order) and the example lists they index (`unit["set"]`)."""
    from midlens.eval.runner import read_rows

    units, sets = [], []
    for folder in options.answers:
        config_file = Path(folder) / "config.json"
        if not config_file.is_file():
            raise InvalidArgumentError(f"{folder}: no config.json; pass an `eval sweep` run folder.")
        config = json.loads(config_file.read_text())
        if config.get("kind") != "sweep":
            raise InvalidArgumentError(f"{folder}: a {config.get('kind')!r} run; pass an `eval sweep` run folder.")
        examples = sweep_examples(config, options.answers_data)
        index = {ex.id: i for i, ex in enumerate(examples)}
        keep = {ex.id for ex in examples[: options.answers_n]}
        rows = [r for f in sorted(Path(folder).glob("results*.jsonl*")) for r in read_rows(f)]
        for row in sorted(rows, key=lambda r: (index.get(r["example_id"], -1), r["position"], r["method"])):
            if row["method"] not in options.answer_methods or row["example_id"] not in keep:
                continue
            if not row["prediction"].strip():
                continue
            units.append(
                {
                    "example": index[row["example_id"]],
                    "set": len(sets),
                    "example_id": row["example_id"],
                    "position": row["position"],
                    "kind": "sweep",
                    "dataset": config["dataset"],
                    "k": config["k"],
                    "answer": row["prediction"],
                    "em": float(row["em"]),
                    "source": f"{config['model']}:{row['method']}",
                    "prompt_style": config.get("prompt_style"),
                }
            )
        sets.append(examples)
    return units, sets


def _slot(index: int) -> int:
    return POSITIONS[index % len(POSITIONS)]


def load_examples(options: CheckRunOptions, max_words: int):
    from midlens.eval.support import SupportRunOptions
    from midlens.eval.support import load_examples as support_examples

    return support_examples(
        SupportRunOptions(Path("."), options.dataset, options.split, n=options.n, k=SUPPORT_K, max_words=max_words)
    )


def plan(options: CheckRunOptions) -> tuple[dict, list[dict], list[list]]:
    """The run's config, its units (each holding the answer to check and its labels) and the example lists they
    index (`unit["set"]`: 0 the run's own questions, then Gemma's passages, then each sweep's); no model is loaded."""
    from midlens.eval.datasets import data_sha256

    if options.split == "train" and set(options.kinds) - set(TRAIN_KINDS) - {"sweep"}:
        raise InvalidArgumentError(f"train runs check {TRAIN_KINDS} answers only, not {options.kinds}.")
    unknown = set(options.kinds) - set(KINDS)
    if unknown:
        raise InvalidArgumentError(f"kinds {sorted(unknown)}: use some of {', '.join(KINDS)}.")
    if ("sweep" in options.kinds) != bool(options.answers):
        raise InvalidArgumentError("kind 'sweep' and --answers go together: name the sweep folders to check.")
    examples = load_examples(options, options.max_words)
    sets: list[list] = [examples]
    other = next(m for m in FOLDERS if m != options.reader)
    answers = {kind: {} for kind in options.kinds}
    if "other" in options.kinds:
        answers["other"] = model_answers(other, options.dataset, options.split)
    if "own" in options.kinds:
        answers["own"] = model_answers(options.reader, options.dataset, options.split)
    gemma_set = None
    if "gemma" in options.kinds and options.dataset == "hotpotqa" and options.split == "eval":
        answers["gemma"] = gemma_answers()
        gemma_set = len(sets)
        sets.append(load_examples(options, GEMMA_MAX_WORDS))
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
                    unit.update(set=gemma_set, max_words=GEMMA_MAX_WORDS)
                    assert sets[gemma_set][i].id == ex.id
            elif kind == "gold":
                unit.update(answer=ex.answers[0], em=1.0)
            elif kind == "wrong":
                entity = distractor_entity(ex, ex.answers[0], rng, avoid=ex.gold.text)
                if entity is None:
                    continue
                unit.update(answer=entity, em=0.0)
            elif kind in ("planted", "added"):  # a right answer with one false sentence: which one is recorded
                made = (planted_answer if kind == "planted" else added_answer)(ex, rng)
                if made is None:
                    continue
                text, planted, spans = made
                unit.update(answer=text, em=0.0, planted=list(planted), sentences=[list(s) for s in spans])
            elif kind == "gold-sentence":
                unit.update(answer=sentence_answer(ex.question, ex.answers[0], rng), em=1.0)
            elif kind == "wrong-sentence":
                entity = distractor_entity(ex, ex.answers[0], rng, avoid=ex.gold.text)
                if entity is None:
                    continue
                unit.update(answer=sentence_answer(ex.question, entity, rng), em=0.0)
            elif kind == "clause":
                text = clause_answer(ex, rng)
                if text is None:
                    continue
                unit.update(answer=text, em=0.0)
            else:  # "sweep": its units come from the sweep folders, below
                continue
            units.append({"key": f"{key}|{kind}", "order": len(units), **unit})
    swept, sweep_sets = sweep_units(options) if "sweep" in options.kinds else ([], [])
    offset = len(sets)
    for unit in swept:
        source = unit["source"].replace(":", "/")
        key = f"{unit['example_id']}|{unit['position']}|sweep|{unit['dataset']}|{source}"
        units.append({"key": key, "order": len(units), **unit, "set": offset + unit["set"]})
    sets.extend(sweep_sets)
    config = {
        "kind": "check-support",
        "reader": options.reader,
        "reader_method": options.reader_method,
        "verify": options.verify,
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
        "answers": [
            {
                "folder": Path(f).as_posix(),
                "data_sha256": json.loads((Path(f) / "config.json").read_text())["data_sha256"],
            }
            for f in options.answers
        ],
        "answer_methods": list(options.answer_methods) if options.answers else [],
        "answers_n": options.answers_n if options.answers else None,
        "units": len(units),
    }
    return config, units, sets


def sentence_labels(inputs: dict, unit: dict) -> list[int]:
    """Per checked sentence (citation), 1 when it is right: for a planted or added answer, every sentence but the one
    overlapping the planted characters; otherwise the answer's own label."""
    spans = inputs["sentence_spans"]
    if "planted" not in unit:
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
    from midlens.rag.pipeline import Pipeline

    torch.set_num_threads(max(1, torch.get_num_threads()))
    config, units, sets = plan(options)
    from midlens.eval.datasets import data_sha256

    def prefix_sha256(count: int) -> str:  # a run grows with a larger --n (the same first questions)
        return data_sha256(sets[0][:count])

    _, _, _, todo = runner.pending_units(options.out, config, units, (0, 1), options.limit, prefix_sha256)
    if not todo:
        return runner.read_rows(Path(options.out) / runner.results_name((0, 1)))
    loaded = load_model(options.reader, "cpu", options.dtype)
    pipe = Pipeline(None, Generator(loaded, method=options.reader_method))

    def evaluate(unit: dict) -> dict:
        example = sets[unit.get("set", 0)][unit["example"]]
        passages = layout(example, unit.get("k", options.k), unit["position"])
        t0 = time.perf_counter()
        answer = pipe.check(example.question, unit["answer"], passages, verify=options.verify)
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
    # The features are the reader's readings: rows read by another method (the fine-tune's) are not the same data.
    # None: a run from before the reader's method was recorded (read with the answering default of its day).
    reading = {c.get("reader_method") for c, _ in loaded}
    if len(reading) != 1:
        named = ", ".join(sorted(str(m or "unrecorded") for m in reading))
        raise InvalidArgumentError(f"runs read by several methods ({named}): fit one method's at a time.")
    (reader_method,) = reading
    rows = [r for _, rs in loaded for r in rs if r["sentence_labels"]]
    from midlens.generators.methods.registry import method_config

    methods = (method_config(reader_method).spec(),) if reader_method else ()
    model = CheckedSupportModel.fit_checked(rows, reader, methods=methods)
    sentences = [label for r in rows for label in r["sentence_labels"]]
    training = {
        "reader_method": reader_method,
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
                "verify": c.get("verify", False),
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
