"""Which prompt slots a model reads best, from a position sweep over every slot: the slot order restacking ships.

    midlens eval sweep --dataset hotpotqa --split train --k 10 --positions 1,2,3,4,5,6,7,8,9,10 --methods baseline \
        ... --out runs/slots-smollm2
    write_slot_order("runs/slots-smollm2", "generators/trained/slot-orders/smollm2-135m.json", command="...")

Slots are ranked by accuracy: mean EM, then mean F1, then the gold answer's mean log-probability (a small model's EM
ties often; the continuous measures break the ties), over the questions answered at every slot.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.files import write_atomic
from midlens.eval.runner import CONFIG, RESULTS, read_rows


def slot_table(rows: list[dict], method: str = "baseline") -> dict[int, dict]:
    """{slot: {"em", "f1", "logprob", "n"}} over the questions with a row at every slot of `method`."""
    mine = [r for r in rows if r.get("kind") == "sweep" and r["method"] == method]
    slots = sorted({r["position"] for r in mine})
    cells = {(r["example_id"], r["position"]): r for r in mine}
    complete = sorted({e for e, _ in cells if all((e, s) in cells for s in slots)})
    if not complete:
        raise MidlensError(f"no question was answered at every slot by {method!r}: run the sweep further.")
    table = {}
    for s in slots:
        sel = [cells[(e, s)] for e in complete]
        table[s] = {
            key: statistics.fmean(r[key] for r in sel) for key in ("em", "f1", "logprob") if all(key in r for r in sel)
        }
        table[s]["n"] = len(sel)
    return table


def rank_slots(table: dict[int, dict]) -> list[int]:
    """Slots best first: EM, then F1, then log-probability (higher is better each), then the earlier slot."""
    return sorted(table, key=lambda s: (-table[s]["em"], -table[s]["f1"], -table[s].get("logprob", 0.0), s))


def write_slot_order(run: str | Path, out: str | Path, command: str, method: str = "baseline") -> dict:
    """The slot-order file of one sweep run (every slot 1..K, one model): the order best first, each slot's measures,
    and what made it (the command, the run's config hash, the dataset and question count)."""
    run = Path(run)
    config = json.loads((run / CONFIG).read_text())
    table = slot_table(read_rows(run / RESULTS), method)
    k = config["k"]
    if sorted(table) != list(range(1, k + 1)):
        raise MidlensError(f"{run} swept slots {sorted(table)}, not every slot 1..{k}: sweep --positions 1,...,{k}.")
    record = {
        "model": config["model"],
        "model_sha256": config["model_sha256"],
        "k": k,
        "order": rank_slots(table),
        "rule": "mean EM, then mean F1, then mean gold-answer log-probability; higher first",
        "slots": {str(s): table[s] for s in sorted(table)},
        "questions": table[1]["n"],
        "dataset": config["dataset"],
        "method": method,
        "prompt_style": config.get("prompt_style"),
        "max_words": config.get("max_words"),
        "max_new_tokens": config.get("max_new_tokens"),
        "command": command,
    }
    write_atomic(Path(out), json.dumps(record, indent=1) + "\n")
    return record
