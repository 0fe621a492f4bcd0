"""Where restacking put the gold passage, from a sweep run's rows: the slot it was answered from and its rank by the
scorer's last pass, per system and starting position, over the questions every system finished.

    python docs/results/restack/placement.py docs/results/restack/eval-smollm2
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

from midlens.eval.runner import read_rows


def main(run: Path) -> None:
    rows = [r for f in sorted(run.glob("results*.jsonl*")) for r in read_rows(f)]
    methods = sorted({r["method"] for r in rows})
    positions = sorted({r["position"] for r in rows})
    done = {(r["example_id"], r["method"], r["position"]) for r in rows}
    complete = {e for e, _, _ in done if all((e, m, p) in done for m in methods for p in positions)}
    print(f"{len(complete)} questions complete for every system and position")
    for m in methods:
        mine = [r for r in rows if r["method"] == m and r["example_id"] in complete and "restack_gold_rank" in r]
        if not mine:
            continue
        slots = Counter(r["gold_prompt_position"] for r in mine)
        top = sum(r["restack_gold_rank"] == 1 for r in mine)
        print(f"\n{m}: gold ranked first by the scorer in {top} of {len(mine)} prompts")
        print("  slot the gold was answered from: " + ", ".join(f"{s}: {n}" for s, n in sorted(slots.items())))
        for p in positions:
            at = [r for r in mine if r["position"] == p]
            mean_slot = statistics.fmean(r["gold_prompt_position"] for r in at)
            mean_rank = statistics.fmean(r["restack_gold_rank"] for r in at)
            print(f"  gold laid out at {p:>2}: answered from slot {mean_slot:.2f} scorer rank {mean_rank:.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
