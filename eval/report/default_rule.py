"""Which answering default a measurement supports.

A method replaces the baseline as a packaged model's default only if, on BOTH corpora (HotpotQA's eval split and
SQuAD), it answers better in exact match AND in token F1, each paired 95 % interval above zero on the average over
gold positions, and it is below the baseline at no gold position (EM). Of the methods that pass, the highest
average EM over the two corpora wins; if none passes, the baseline stays. Both metrics, because each alone turns
answer style into accuracy (EM credits a sentence that contains the answer, F1 punishes every extra word).

A trained method is judged only outside its training data: a corpus its shipped artefact (or a restacked system's
scorer's) was trained on, as the artefact's metadata records, is in-domain for it, reported beside the decision and
not in it; its average EM is then the average over the corpora it is judged on. A method trained on every corpus
measured cannot pass.

A restacked system (`METHOD+restack(SCORER)`) costs a scoring prefill per answer on top of METHOD's, so it must
also beat METHOD alone where both were measured: its EM minus METHOD's, paired over the questions of the corpora it
is judged on, with a 95 % interval above zero. Otherwise METHOD is the cheaper system that answers as well, and it
is preferred.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from midlens.core.method_spec import RESTACK_MARK
from midlens.eval.metrics import bootstrap_ci
from midlens.eval.report.summarise import sweep_summary

CORPORA = ("hotpotqa", "squad")


@dataclass
class Verdict:
    method: str
    passes: bool
    average_em: float  # mean over the corpora it is judged on of the method's average EM
    reasons: list[str] = field(default_factory=list)  # why it fails (empty when it passes)
    in_domain: list[str] = field(default_factory=list)  # corpora it was trained on: beside the decision


def trained_on(method: str, model: str | None) -> frozenset[str]:
    """The corpora (of CORPORA) the shipped artefacts `method` (a table's label) reads on `model` were trained on,
    as their metadata's `data` names them; a restacked system's scorer counts too. Empty for a method that trains
    nothing, a label that is no method spec (an ordering), or an unknown model."""
    from midlens.core.errors import MethodConfigError
    from midlens.generators.artefacts import META
    from midlens.generators.methods.registry import method_config, shipped_artefact_of

    if model is None:
        return frozenset()
    plain, _, scorer = method.partition(RESTACK_MARK)
    corpora: set[str] = set()
    for spec in (plain, scorer.removesuffix(")")):
        try:
            folder = shipped_artefact_of(method_config(spec), model) if spec else None
        except MethodConfigError:
            continue
        if folder is not None:
            data = json.dumps(json.loads((folder / META).read_text()).get("data", {})).lower()
            corpora |= {c for c in CORPORA if c in data}
    return frozenset(corpora)


def judge(
    rows: list[dict], against: str = "baseline", trained: Callable[[str, str | None], frozenset[str]] = trained_on
) -> list[Verdict] | None:
    """A verdict per method measured beside `against`, best first; None when the rows do not hold
    sweeps of both corpora (one table per corpus: a corpus swept under two settings is ambiguous and refused).
    `trained(method, model)`: the corpora a method was trained on (the rows' model; in-domain, beside)."""
    model = next((r["setting"].get("model") for r in rows if r.get("setting")), None)
    tables: dict[str, dict] = {}
    for label, s in sweep_summary(rows, against).items():
        corpus = next((c for c in CORPORA if label.startswith(c)), None)  # "squad-v2-dev (K=10, ...)" is SQuAD
        if corpus is not None:
            if corpus in tables:
                return None
            tables[corpus] = s
    if set(tables) != set(CORPORA) or any(against not in t["methods"] for t in tables.values()):
        return None
    methods = {m for t in tables.values() for m in t["methods"] if m != against}
    verdicts = []
    for m in methods:
        reasons = []
        in_domain = [c for c in CORPORA if c in trained(m, model)]
        judged = [c for c in CORPORA if c not in in_domain]
        if not judged:
            reasons.append(f"trained on {' and '.join(in_domain)}: no corpus outside its training data measured")
        # A corpus the decision reads must be measured; an in-domain one need not be (it is only shown beside).
        reasons += [f"{c} not run" for c in judged if m not in tables[c]["methods"]]
        judged = [c for c in judged if m in tables[c]["methods"]]
        for corpus in judged:
            t = tables[corpus]
            for metric in ("em", "f1"):
                diff, (low, _high) = t["paired"][m][metric]
                if not low > 0:
                    reasons.append(f"{corpus} {metric.upper()} {100 * diff:+.1f} [{100 * low:+.1f}, ...] not above 0")
            for p in t["positions"]:
                ours, base = t["methods"][m]["positions"][p]["em"], t["methods"][against]["positions"][p]["em"]
                if ours < base:
                    reasons.append(f"{corpus} gold@{p} EM {100 * ours:.1f} below {100 * base:.1f}")
        plain = m.split(RESTACK_MARK, 1)[0]
        alone = [c for c in judged if plain in tables[c]["methods"]]
        if plain != m and alone:
            diffs = [
                em - tables[c]["methods"][plain]["per_example_em"][e]
                for c in alone
                for e, em in tables[c]["methods"][m]["per_example_em"].items()
            ]
            low, high = bootstrap_ci(diffs)
            if not low > 0:
                mean = 100 * sum(diffs) / len(diffs)
                reasons.append(
                    f"EM {mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] over {plain} alone on "
                    f"{' and '.join(alone)}, not above 0 (restacking adds a scoring prefill per answer)"
                )
        measured = judged or [c for c in CORPORA if m in tables[c]["methods"]]
        average = sum(tables[c]["methods"][m]["avg"] for c in measured) / len(measured)
        verdicts.append(Verdict(m, not reasons, average, reasons, in_domain))
    return sorted(verdicts, key=lambda v: (not v.passes, -v.average_em, v.method))


def chosen(verdicts: list[Verdict], against: str = "baseline") -> str:
    """The default the verdicts support: the best method that passes, else `against`."""
    return next((v.method for v in verdicts if v.passes), against)


def _named(method: str) -> str:
    """The method with the shorthand users know it by, where it has one: the name the default is switched to."""
    from midlens.core.names import METHOD_SHORTHANDS

    known = [f"`{short}`" for short, spec in METHOD_SHORTHANDS.items() if spec == method]
    return f"{method} ({', '.join(known)})" if known else method


def markdown_lines(rows: list[dict], against: str = "baseline") -> list[str]:
    """The report's section on the rule, or nothing when the rows cannot decide it."""
    verdicts = judge(rows, against)
    if verdicts is None:
        return []
    lines = [
        "",
        "## The answering default these sweeps support",
        "",
        f"Rule: above {against} on both HotpotQA and SQuAD in EM and in F1 (paired 95 % interval above zero), "
        "below it at no gold position (a restacked system also above its method alone, paired over the corpora judged: "
        "it costs a prefill more); a trained method on the corpora outside its training data only; the best average "
        f"EM of those that pass. **Supported default: {_named(chosen(verdicts, against))}.**",
        "",
        "| method | average EM over the corpora judged | in-domain (beside) | passes | why not |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        verdict = "yes" if v.passes else "no"
        beside = ", ".join(v.in_domain) or "-"
        lines.append(f"| {v.method} | {100 * v.average_em:.1f} | {beside} | {verdict} | {'; '.join(v.reasons)} |")
    return lines
