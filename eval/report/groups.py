"""Which rows make one table, what the table is called, and the order methods are listed in.

Runs whose answers were produced under different settings (token budget, paragraph clipping, evidence
configuration, model) are never pooled: each setting gets its own group, labelled by what differs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable

from midlens.core.defaults import METHODS, ORDERINGS
from midlens.eval.report.load import SETTINGS


def grouped(
    rows: list[dict],
    kind: str,
    base: Callable[[dict], object],
    shown: tuple[str, ...] = (),
    family: Callable[[object], object] = lambda b: b,
) -> dict[tuple, tuple[str, list[dict]]]:
    """Rows of one kind by base(row) and setting -> {(base, setting): (label suffix, rows)}; the suffix
    names each setting that differs between groups of the same family (by default: the same base), so no two
    tables look alike."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["kind"] == kind:
            groups[(base(r), json.dumps(r.get("setting", {}), sort_keys=True))].append(r)
    out = {}
    for b, setting in groups:
        siblings = [json.loads(s) for bb, s in groups if family(bb) == family(b)]
        this = json.loads(setting)
        differs = [
            key
            for key in SETTINGS
            if key not in shown and len({json.dumps(s.get(key), sort_keys=True) for s in siblings}) > 1
        ]
        out[(b, setting)] = ("".join(_differing(key, this, siblings) for key in differs), groups[(b, setting)])
    return out


def _differing(key: str, this: dict, siblings: list[dict]) -> str:
    """ ", key=value" for a setting that differs between groups; of a dict (evidence), only the entries that differ,
    so a label stays short enough for a plot title."""
    value = this.get(key)
    if not isinstance(value, dict):
        return f", {key}={value}"
    values = [s.get(key) or {} for s in siblings]
    sub = [k for k in value if len({json.dumps(v.get(k), sort_keys=True) for v in values}) > 1]
    return "".join(f", {key} {k}={value[k]}" for k in sub) or f", {key}={value}"


def method_order(m: str) -> tuple[int, str]:
    """Registered methods in registration order (baseline first), then the orderings, then anything else; a spec
    such as `mudaf(alpha=0)` sorts with its method, and so does its restacked system (`baseline+restack(mudaf)`)."""
    order = [*METHODS, *ORDERINGS]
    name = m.split("(", 1)[0].split("+", 1)[0].strip()
    return (order.index(name) if name in order else len(order), m)
