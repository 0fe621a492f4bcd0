"""Seed a restacking run with the plain method's rows of an earlier sweep on the same questions, so the run computes
only the restacked system (a restack sweep answers the plain method too, to pair with it).

    midlens eval sweep ... --methods "mudaf(alpha=0)" --restack mudaf --limit 0 --out runs/restack-ft-hotpotqa
    python docs/results/restack/seed_plain_rows.py docs/results/smollm2-135m/short-answer/runs/hotpotqa \
        runs/restack-ft-hotpotqa "mudaf(alpha=0)" --shards 2

Copied only where both runs asked the same thing: the same model, questions (data hash), slots, prompt settings and
the method's recorded config (its hash). Each copied row keeps the `config_sha256` of the run that computed it, so
the rows say where they came from; its `order` is renumbered to the new run's layout (the plain method first, as the
sweep plans it). Rows go to the shard files the new run's shards read (`example % shards`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from midlens.eval.runner import CONFIG, RESULTS, read_rows, results_name

SAME = (
    "model_sha256",
    "data_sha256",
    "dataset",
    "k",
    "positions",
    "max_words",
    "max_new_tokens",
    "prompt_style",
    "stop_at_line_end",
    "evidence",
    "seed",
    "dtype",
    "logprob",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path, help="the earlier run (config.json + results.jsonl[.gz])")
    ap.add_argument("target", type=Path, help="the restacking run, its config written (--limit 0)")
    ap.add_argument("method", help="the plain method label whose rows to copy")
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args()
    old = json.loads((args.source / CONFIG).read_text())
    new = json.loads((args.target / CONFIG).read_text())
    differ = [key for key in SAME if old.get(key) != new.get(key)]
    if old["methods_sha256"].get(args.method) != new["methods_sha256"].get(args.method):
        differ.append(f"methods_sha256[{args.method}]")
    if differ:
        raise SystemExit(f"{args.source} and {args.target} differ in {', '.join(differ)}: nothing copied.")
    if old["examples"] < new["examples"]:
        raise SystemExit(f"{args.source} holds {old['examples']} questions, {args.target} asks {new['examples']}.")
    source = args.source / RESULTS
    rows = read_rows(source if source.exists() else source.with_suffix(".jsonl.gz"))
    positions = new["positions"]
    per = len(new["methods"]) * len(positions)
    copied = [r for r in rows if r["method"] == args.method and r["example"] < new["examples"]]
    by_shard: dict[int, list[dict]] = {}
    for row in copied:
        row = {**row, "order": row["example"] * per + positions.index(row["position"])}
        by_shard.setdefault(row["example"] % args.shards, []).append(row)
    for shard, mine in sorted(by_shard.items()):
        path = args.target / results_name((shard, args.shards))
        done = {r["key"] for r in read_rows(path)}
        fresh = [r for r in mine if r["key"] not in done]
        with path.open("a") as handle:
            handle.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in fresh)
        print(f"{path}: {len(fresh)} rows of {args.method} copied ({len(mine) - len(fresh)} were there)")


if __name__ == "__main__":
    main()
