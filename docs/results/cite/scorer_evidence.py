"""Would another method's evidence make better citations? A check on stored `eval cite` rows plus one scoring pass.

The citation rule blends the prompt's passage evidence into each answer sentence's attention share; the library
takes that evidence from the answering pass itself. MuDAF's delta ranks the supporting paragraphs best of every
ranker measured, and restacking already runs it as a scorer. This script scores the SAME prompts an `eval cite`
run answered with a scorer method (one prefill each, batched, no generation; resumable, one line per prompt), then
grades the library's rule with the scorer's evidence in place of the answering pass's own. The rule is chosen on the
train rows; the eval rows only report what it scores, paired against the run's own rule on the same answers.

    python docs/results/cite/scorer_evidence.py score RUN_DIR SCORER OUT.jsonl [QUESTIONS]   # resumable
    python docs/results/cite/scorer_evidence.py grade TRAIN_DIR TRAIN_SCORES EVAL_DIR EVAL_SCORES
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import sys
from pathlib import Path

from tqdm import tqdm

from midlens.eval.cite import CiteOptions, cited_sets, gold_sets, layout, plan, prf, run_rule
from midlens.eval.runner import read_rows

GRID = [
    (w, r, max_sources, min_share)
    for w in (0.0, 0.25, 0.5, 0.75, 1.0)
    for r in (0.0, 0.25, 0.5, 0.75, 1.0)
    if w + r <= 1
    for max_sources in (1, 2, 3)
    for min_share in (0.0, 0.3, 0.5, 0.7, 0.9)
]
BATCH = 4


def options_of(run: Path) -> CiteOptions:
    """The options that make `run`'s prompts again (its config records every one that shapes a prompt)."""
    c = json.loads((run / "config.json").read_text())
    split = "eval" if c["dataset"] == "hotpotqa" else c["dataset"].removeprefix("hotpotqa-")
    return CiteOptions(
        out=run,
        model=c["model"],
        n=c["examples"],
        seed=c["seed"],
        split=split,
        max_words=c["max_words"],
        positions=tuple(c["positions"]),
        max_new_tokens=c["max_new_tokens"],
        prompt_style=c["prompt_style"],
    )


def rule_of(run: Path, scorer: str | None) -> dict:
    """The rule the library applies today to the run's model and method, with `scorer`'s evidence blended in (None:
    the answering pass's own); the run's rule.json is the one of its day."""
    methods = list(json.loads((run / "config.json").read_text())["methods"])
    return run_rule(dataclasses.replace(options_of(run), cite_evidence=scorer), methods)


def rows_of(run: Path) -> dict[tuple[str, int], dict]:
    """The run's rows: its committed results.jsonl.gz, else the results files of a run in progress (shards too)."""
    packed = run / "results.jsonl.gz"
    paths = [packed] if packed.exists() else sorted(run.glob("results*.jsonl"))
    rows = [r for path in paths for r in read_rows(path)]  # a torn last line (a run still writing) is left out
    return {(r["example_id"], r["position"]): r for r in rows if r.get("kind") == "cite"}


def pending(out: Path, examples: list, positions: list[int], rows: dict) -> list[tuple]:
    """(example, position) pairs with a row in the run and no line yet in `out` (the resumable output). Only prompts
    the run has answered: a run still growing, or one shard of it, has rows for some questions."""
    done = set()
    if out.exists():
        done = {(d["example_id"], d["position"]) for d in map(json.loads, out.read_text().splitlines())}
    return [(ex, p) for ex in examples for p in positions if (ex.id, p) in rows and (ex.id, p) not in done]


def score(run: Path, scorer: str, out: Path, questions: int | None = None) -> None:
    """`questions`: score only the run's first so many questions (every position of each)."""
    from midlens.generators.answering.generator import Generator
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.models.loading import load_model

    options = options_of(run)
    config, _, examples = plan(options)
    rows = rows_of(run)
    todo = pending(out, examples[:questions], config["positions"], rows)
    gen = Generator(load_model(options.model), method=scorer, evidence=EvidenceConfig(**config["evidence"]))
    with out.open("a") as f, tqdm(total=len(todo), desc=f"{scorer} evidence") as bar:
        for start in range(0, len(todo), BATCH):
            chunk = todo[start : start + BATCH]
            prompts = [
                gen.prompt(ex.question, layout(ex, p, options.seed), options.max_new_tokens, style=options.prompt_style)
                for ex, p in chunk
            ]
            for (ex, p), answer in zip(chunk, gen.score_batch(prompts), strict=True):
                # The same prompt the run answered, or the scores belong to another layout.
                assert answer.prompt_tokens == rows[(ex.id, p)]["prompt_tokens"], (ex.id, p)
                line = {
                    "example_id": ex.id,
                    "position": p,
                    "scorer": scorer,
                    "evidence": [pe.score for pe in answer.passages],
                    "evidence_raw": [pe.evidence for pe in answer.passages],
                }
                f.write(json.dumps(line) + "\n")
                f.flush()
                os.fsync(f.fileno())
            bar.update(len(chunk))


def swapped(rows: dict, scores_path: Path) -> tuple[list[dict], list[dict]]:
    """(the rows as run, the same rows with the scorer's evidence), over the prompts both have."""
    scores = {(d["example_id"], d["position"]): d for d in map(json.loads, scores_path.read_text().splitlines())}
    keys = sorted(set(rows) & set(scores))
    own = [rows[k] for k in keys]
    other = [dict(rows[k], evidence=scores[k]["evidence"], evidence_raw=scores[k]["evidence_raw"]) for k in keys]
    return own, other


def f1s(rows: list[dict], rule: tuple[float, float, int, float]) -> list[float]:
    w, r, max_sources, min_share = rule
    return [
        100 * prf(cited_sets(row, "midlens", max_sources, min_share, w, r)[0], gold_sets(row)[0])["f1"] for row in rows
    ]


def paired(a: list[float], b: list[float], rows: list[dict], seed: int = 0) -> str:
    """Mean of a - b with a 95 % bootstrap interval over questions (an answer's three positions move together)."""
    by: dict[str, list[float]] = {}
    for x, y, row in zip(a, b, rows, strict=True):
        by.setdefault(row["example_id"], []).append(x - y)
    questions = sorted(by)
    rng = random.Random(seed)
    means = sorted(
        sum(d for q in sample for d in by[q]) / sum(len(by[q]) for q in sample)
        for sample in (rng.choices(questions, k=len(questions)) for _ in range(2000))
    )
    mean = sum(x - y for x, y in zip(a, b, strict=True)) / len(a)
    return f"{mean:+.1f} [{means[49]:+.1f}, {means[1949]:+.1f}]"


def grade(train_dir: Path, train_scores: Path, eval_dir: Path, eval_scores: Path) -> None:
    def shipped(run: Path) -> tuple[float, float, int, float]:
        rule = rule_of(run, None)
        return (rule["evidence_weight"], rule["raw_evidence_weight"], rule["max_sources"], rule["min_share"])

    train_own, train_other = swapped(rows_of(train_dir), train_scores)
    grid = sorted(((sum(f1s(train_other, g)) / len(train_other), g) for g in GRID), reverse=True)
    best = grid[0][1]
    print(
        f"train: {len(train_own)} answers; own evidence, shipped rule {shipped(train_dir)}: "
        f"{sum(f1s(train_own, shipped(train_dir))) / len(train_own):.1f}"
    )
    for value, g in grid[:5]:
        print(f"  scorer evidence, w={g[0]} r={g[1]} max_sources={g[2]} min_share={g[3]}: {value:.1f}")
    own, other = swapped(rows_of(eval_dir), eval_scores)
    base, new = f1s(own, shipped(eval_dir)), f1s(other, best)
    print(f"eval: {len(own)} answers ({len({r['example_id'] for r in own})} questions)")
    print(f"  own evidence, shipped rule: {sum(base) / len(base):.1f}")
    print(f"  scorer evidence, train-best rule {best}: {sum(new) / len(new):.1f}; paired {paired(new, base, own)}")
    for position in sorted({r["position"] for r in own}):
        at = [i for i, r in enumerate(own) if r["position"] == position]
        before, after = sum(base[i] for i in at) / len(at), sum(new[i] for i in at) / len(at)
        difference = paired([new[i] for i in at], [base[i] for i in at], [own[i] for i in at])
        print(f"    gold@{position}: {before:.1f} -> {after:.1f}  paired {difference}")
    for g in itertools.islice((g for _, g in grid), 1, 3):
        alt = f1s(other, g)
        print(f"  (runner-up {g}: {sum(alt) / len(alt):.1f})")


if __name__ == "__main__":
    if sys.argv[1] == "score":
        score(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else None)
    else:
        grade(*(Path(a) for a in sys.argv[2:6]))
