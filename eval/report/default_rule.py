"""Which answering default a measurement supports.

A method replaces the baseline as a packaged model's default only if, on BOTH corpora (HotpotQA's eval split and
SQuAD), it answers better in exact match AND in token F1, each paired 95 % interval above zero on the average over
gold positions, and it is below the baseline at no gold position (EM). Of the methods that pass, the highest
average EM over the two corpora wins; if none passes, the baseline stays. Both metrics, because each alone turns
answer style into accuracy (EM credits a sentence that contains the answer, F1 punishes every extra word).

A restacked system (`METHOD+restack(SCORER)`) costs a scoring prefill per answer on top of METHOD's, so it must
also beat METHOD alone where both were measured: its EM minus METHOD's, paired over the questions of both corpora,
with a 95 % interval above zero. Otherwise METHOD is the cheaper system that answers as well, and it is preferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from midlens.core.method_spec import RESTACK_MARK
from midlens.eval.metrics import bootstrap_ci
from midlens.eval.report.summarise import sweep_summary

CORPORA = ("hotpotqa", "squad")


@dataclass
class Verdict:
    method: str
    passes: bool
    average_em: float  # mean over the corpora of the method's average EM
    reasons: list[str] = field(default_factory=list)  # why it fails (empty when it passes)


def judge(rows: list[dict], against: str = "baseline") -> list[Verdict] | None:
    """A verdict per method measured on both corpora beside `against`, best first; None when the rows do not hold
    sweeps of both corpora (one table per corpus: a corpus swept under two settings is ambiguous and refused)."""
    tables: dict[str, dict] = {}
    for label, s in sweep_summary(rows, against).items():
        corpus = next((c for c in CORPORA if label.startswith(c)), None)  # "squad-v2-dev (K=10, ...)" is SQuAD
        if corpus is not None:
            if corpus in tables:
                return None
            tables[corpus] = s
    if set(tables) != set(CORPORA) or any(against not in t["methods"] for t in tables.values()):
        return None
    methods = set.intersection(*({m for m in t["methods"] if m != against} for t in tables.values()))
    verdicts = []
    for m in methods:
        reasons = []
        for corpus in CORPORA:
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
        if plain != m and plain in methods:
            diffs = [
                em - tables[c]["methods"][plain]["per_example_em"][e]
                for c in CORPORA
                for e, em in tables[c]["methods"][m]["per_example_em"].items()
            ]
            low, high = bootstrap_ci(diffs)
            if not low > 0:
                mean = 100 * sum(diffs) / len(diffs)
                reasons.append(
                    f"EM {mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] over {plain} alone on both corpora, not "
                    "above 0 (restacking adds a scoring prefill per answer)"
                )
        average = sum(tables[c]["methods"][m]["avg"] for c in CORPORA) / len(CORPORA)
        verdicts.append(Verdict(m, not reasons, average, reasons))
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
        "below it at no gold position (a restacked system also above its method alone, paired over both corpora: it "
        "costs a prefill more); the best average EM of those that pass. "
        f"**Supported default: {_named(chosen(verdicts, against))}.**",
        "",
        "| method | average EM over both corpora | passes | why not |",
        "|---|---|---|---|",
    ]
    for v in verdicts:
        verdict = "yes" if v.passes else "no"
        lines.append(f"| {v.method} | {100 * v.average_em:.1f} | {verdict} | {'; '.join(v.reasons)} |")
    return lines
