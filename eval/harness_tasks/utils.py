"""The `midlens_mdqa` task's data and scoring for lm-evaluation-harness (midlens_mdqa.yaml names these)."""

from __future__ import annotations

from datasets import Dataset, DatasetDict

from midlens.eval.datasets import load_hotpotqa, load_squad
from midlens.eval.metrics import answer_f1, best_subspan_em
from midlens.eval.sweep import layout
from midlens.generators.models.prompt import user_content


def mdqa(
    dataset: str = "hotpotqa",
    split: str | None = None,
    n: int = 200,
    seed: int = 0,
    k: int = 10,
    position: int = 1,
    max_words: int = 60,
    style: str = "short",
    **_harness: object,
) -> DatasetDict:
    """The examples a position sweep with these settings reads (eval.plan: same loader, n, seed, K and clipping),
    each as its RAG prompt's user turn with the gold passage at `position` (1-based). Keys the harness adds to the
    task's metadata (its version, ...) are not the data's and are ignored. `split` None: HotpotQA's eval split,
    all of SQuAD (as the sweeps default). The sweeps' n is 200: `--limit` takes the first questions of those."""
    if dataset == "hotpotqa":
        examples = load_hotpotqa(n, seed, mode="mdqa", k=k, max_words=max_words, split=split or "eval")
    elif dataset == "squad":
        examples = load_squad(n, seed, k=k, max_words=max_words, split=split)
    else:
        raise ValueError(f"dataset={dataset!r}: midlens_mdqa reads hotpotqa or squad.")
    rows = [
        {
            "id": ex.id,
            "question": ex.question,
            "answers": list(ex.answers),
            "position": position,
            "prompt": user_content(layout(ex, k, position), ex.question, style),
        }
        for ex in examples
    ]
    return DatasetDict({"test": Dataset.from_list(rows)})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """EM (the gold answer as a normalised sub-span of the answer) and F1, as the sweeps score a row."""
    prediction = results[0].strip()
    return {"em": best_subspan_em(prediction, doc["answers"]), "f1": answer_f1(prediction, doc["answers"])}
