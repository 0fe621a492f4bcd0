"""Which prompt slots a model reads best, from a position sweep over every slot: the slot order restacking ships.

    midlens eval sweep --dataset hotpotqa --split train --k 10 --positions 1,2,3,4,5,6,7,8,9,10 --methods baseline \
        ... --out runs/slots-smollm2
    write_slot_order("runs/slots-smollm2", "generators/trained/slot-orders/smollm2-135m.json", command="...")

Slots are ranked by accuracy: mean EM, then mean F1, then the gold answer's mean log-probability, over the questions
answered at every slot. A measure ranks the slots only where it separates them beyond noise: the best slot minus the
worst, paired over the questions, has a 95 % bootstrap interval above zero. A small model's EM is often one question
in twenty at any slot, and an order decided by that one question would be noise; such a measure is passed over and
the next one decides (the ones after it still break its ties). What decided is written into the file.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from midlens.core.errors import MidlensError, Remedy
from midlens.core.saved_parts import save_json_artefact
from midlens.eval.metrics import bootstrap_ci
from midlens.eval.runner import CONFIG, RESULTS, read_rows

MEASURES = ("em", "f1", "logprob")  # accuracy first, the continuous measures after


def slot_cells(rows: list[dict], method: str = "baseline") -> tuple[list[int], list[str], dict[tuple[str, int], dict]]:
    """(slots, the questions with a row at every slot, {(question, slot): row}) of one method's sweep rows."""
    mine = [r for r in rows if r.get("kind") == "sweep" and r["method"] == method]
    slots = sorted({r["position"] for r in mine})
    cells = {(r["example_id"], r["position"]): r for r in mine}
    complete = sorted({e for e, _ in cells if all((e, s) in cells for s in slots)})
    if not complete:
        raise MidlensError(f"no question was answered at every slot by {method!r}: run the sweep further.")
    return slots, complete, cells


def slot_table(rows: list[dict], method: str = "baseline") -> dict[int, dict]:
    """{slot: {"em", "f1", "logprob", "n"}} over the questions with a row at every slot of `method`."""
    slots, complete, cells = slot_cells(rows, method)
    table = {}
    for s in slots:
        sel = [cells[(e, s)] for e in complete]
        table[s] = {key: statistics.fmean(r[key] for r in sel) for key in MEASURES if all(key in r for r in sel)}
        table[s]["n"] = len(sel)
    return table


def separation(rows: list[dict], method: str = "baseline") -> dict[str, dict]:
    """Per measure: the best and the worst slot by its mean, and the 95 % bootstrap interval of best minus worst,
    paired over the questions answered at every slot."""
    slots, complete, cells = slot_cells(rows, method)
    table = slot_table(rows, method)
    out = {}
    for key in MEASURES:
        if key not in table[slots[0]]:
            continue
        best = max(slots, key=lambda s: (table[s][key], -s))
        worst = min(slots, key=lambda s: (table[s][key], -s))
        diffs = [cells[(e, best)][key] - cells[(e, worst)][key] for e in complete]
        out[key] = {"best": best, "worst": worst, "difference": statistics.fmean(diffs), "ci": bootstrap_ci(diffs)}
    return out


def deciding_measure(separated: dict[str, dict]) -> str:
    """The first measure (EM, F1, log-probability) whose best-minus-worst interval lies above zero; the last
    measure measured when none does (it still orders the slots, and the file says nothing separated them)."""
    for key in MEASURES:
        if key in separated and separated[key]["ci"][0] > 0:
            return key
    return [key for key in MEASURES if key in separated][-1]


def rank_slots(table: dict[int, dict], decided_by: str = "em") -> list[int]:
    """Slots best first by `decided_by`, its ties broken by the measures after it (higher first), then the earlier
    slot. `decided_by="em"` is plain accuracy order: EM, then F1, then log-probability."""
    keys = MEASURES[MEASURES.index(decided_by) :]
    return sorted(table, key=lambda s: (*(-table[s].get(k, 0.0) for k in keys), s))


def write_slot_order(run: str | Path, out: str | Path, command: str, method: str = "baseline") -> dict:
    """The slot-order file of one sweep run (every slot 1..K, one model): the order best first, the measure that
    decided it and how far each measure separated the slots, each slot's means, and what made it (the command, the
    dataset and question count). Written as a verified JSON artefact (core.saved_parts.save_json_artefact): the
    reader (generators.answering.restack.read_slot_order) refuses it once edited."""
    run = Path(run)
    config = json.loads((run / CONFIG).read_text())
    rows = read_rows(run / RESULTS)
    table = slot_table(rows, method)
    k = config["k"]
    if sorted(table) != list(range(1, k + 1)):
        raise MidlensError(
            f"{run} swept slots {sorted(table)}, not every slot 1..{k}: a slot order ranks them all.",
            [Remedy("positions", list(range(1, k + 1)), "to the sweep")],
        )
    separated = separation(rows, method)
    decided_by = deciding_measure(separated)
    record = {
        "model": config["model"],
        "model_sha256": config["model_sha256"],
        "k": k,
        "order": rank_slots(table, decided_by),
        "decided_by": decided_by,
        "rule": "mean EM, then mean F1, then mean gold-answer log-probability, higher first; a measure whose best "
        "slot minus worst slot (paired over questions, 95 % bootstrap) does not lie above zero is passed over",
        "order_by_accuracy": rank_slots(table, "em"),
        "separation": separated,
        "slots": {str(s): table[s] for s in sorted(table)},
        "questions": table[1]["n"],
        "dataset": config["dataset"],
        "method": method,
        "prompt_style": config.get("prompt_style"),
        "max_words": config.get("max_words"),
        "max_new_tokens": config.get("max_new_tokens"),
        "command": command,
    }
    save_json_artefact(out, record)  # atomic, its sha256 recorded in the folder's manifest for the reader to verify
    return record
