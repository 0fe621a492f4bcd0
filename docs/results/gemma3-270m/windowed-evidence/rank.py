"""The gold passage's evidence rank under each candidate layer rule, from `collect.py`'s stored maps.

A passage's score is the library's: the mean over the rule's layers and all heads of the question tokens' attention
mass on it, minus the same for the content-free question (calibrated; ties broken by prompt order, as
`passage_evidence` sorts). Which layers "see" a passage comes from `generators.attention.evidence.layers_reaching`, from
the first question token: the query the evidence is read for.

    python docs/results/gemma3-270m/windowed-evidence/rank.py maps-train.jsonl.gz maps-eval.jsonl.gz --json ranks.json
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys

import torch

from midlens.generators.attention.evidence import layers_reaching

WINDOW = 512
WINDOWS = [None if i in (5, 11, 17) else WINDOW for i in range(18)]  # gemma3-270m: global layers 5, 11, 17
UPPER, ALL = list(range(9, 18)), list(range(18))
GLOBAL = [i for i, w in enumerate(WINDOWS) if w is None]

CHOSEN = "global layers (5, 11, 17)"  # the best mean rank over the slots on the train split (then MRR)
# name -> (layers, weighting): "mean" averages every listed layer, "seen" only those whose window reaches the passage.
RULES = {
    "upper (before)": (UPPER, "mean"),
    "upper, each passage over its seeing layers": (UPPER, "seen"),
    "all, each passage over its seeing layers": (ALL, "seen"),
    "global layers (5, 11, 17)": (GLOBAL, "mean"),
    "upper global layers (11, 17)": ([11, 17], "mean"),
    "all layers": (ALL, "mean"),
}


def scores(row: dict, layers: list[int], weighting: str, query: str = "question") -> list[float]:
    raw = torch.tensor(row[query]).mean(1)  # [layers, passages], mean over heads
    null = torch.tensor(row[f"null_{query}"]).mean(1)
    first = row["question_span"][0] if query == "question" else row["prompt_tokens"] - 1
    out = []
    for p, span in enumerate(row["spans"]):
        chosen = layers if weighting == "mean" else layers_reaching(tuple(span), first, WINDOWS, layers)
        out.append(float((raw[chosen, p] - null[chosen, p]).mean()))
    return out


def gold_rank(row: dict, layers: list[int], weighting: str) -> int:
    s = scores(row, layers, weighting)
    g = row["gold"] - 1
    return 1 + sum(x > s[g] or (x == s[g] and i < g) for i, x in enumerate(s))


def table(rows: list[dict]) -> dict:
    out = {}
    for name, (layers, weighting) in RULES.items():
        per_slot = {}
        for slot in (1, 5, 10):
            ranks = [gold_rank(r, layers, weighting) for r in rows if r["slot"] == slot]
            per_slot[slot] = {
                "mean_rank": statistics.fmean(ranks),
                "top1": sum(r == 1 for r in ranks) / len(ranks),
                "n": len(ranks),
            }
        ranks_all = [gold_rank(r, layers, weighting) for r in rows]
        mrr = statistics.fmean(1 / x for x in ranks_all)
        out[name] = {"slots": per_slot, "mean_rank": statistics.fmean(ranks_all), "mrr": mrr}
    return out


def paired(rows: list[dict], rule: str, base: str = "upper (before)") -> dict:
    """Per slot and over all: mean of (rule's gold rank - base's), per prompt, with its 95 % bootstrap interval."""
    from midlens.eval.metrics import bootstrap_ci

    out = {}
    for slot in (1, 5, 10, None):
        sel = [r for r in rows if slot is None or r["slot"] == slot]
        diffs = [gold_rank(r, *RULES[rule]) - gold_rank(r, *RULES[base]) for r in sel]
        out["all" if slot is None else slot] = {"difference": statistics.fmean(diffs), "ci": bootstrap_ci(diffs)}
    return out


def main(paths: list[str], out: str | None) -> None:
    results = {}
    for path in paths:
        with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        # Only questions scored at every slot (a run stopped for time may end inside one).
        slots: dict[str, set[int]] = {}
        for r in rows:
            slots.setdefault(r["key"].split("|")[0], set()).add(r["slot"])
        rows = [r for r in rows if slots[r["key"].split("|")[0]] == {1, 5, 10}]
        results[path] = table(rows)
        print(f"\n{path}: {len(rows)} prompts, {sum(r['slot'] == 1 for r in rows)} questions")
        print(f"{'rule':48s} {'slot 1':>7s} {'slot 5':>7s} {'slot 10':>7s} {'mean':>6s} {'MRR':>6s}")
        for name, t in results[path].items():
            s = t["slots"]
            print(
                f"{name:48s} {s[1]['mean_rank']:7.2f} {s[5]['mean_rank']:7.2f} {s[10]['mean_rank']:7.2f} "
                f"{t['mean_rank']:6.2f} {t['mrr']:6.3f}"
            )
        chosen = paired(rows, CHOSEN)
        results[path]["chosen_minus_before"] = {str(k): v for k, v in chosen.items()}
        print(
            f"{CHOSEN} minus upper, paired per prompt, mean [95 % CI]: "
            + ", ".join(
                f"{'slot ' + str(k) if k != 'all' else 'all'} {v['difference']:+.2f} "
                f"[{v['ci'][0]:+.2f}, {v['ci'][1]:+.2f}]"
                for k, v in chosen.items()
            )
        )
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    out = args[args.index("--json") + 1] if "--json" in args else None
    main([a for a in args if a.endswith((".jsonl", ".jsonl.gz"))], out)
