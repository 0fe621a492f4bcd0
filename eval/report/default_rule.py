"""Which answering default a measurement supports, judged on whole systems as they ship.

A candidate is a whole answering configuration: its method (a restacked one included: scorer, rounds and slot
policy are in its label) and its instruction; the token budget, stop rule, passages and dtype are conditions every
run the rule reads must share (`check_comparable` refuses runs that differ, naming the field), and the shipped
defaults must be those conditions (tests/test_defaults.py). The reference is the plain model as it ships: the
baseline under Liu et al.'s instruction (`litm`). A candidate under another instruction is labelled
`METHOD @STYLE` and judged like any other, so if it wins, its instruction ships with it.

A candidate replaces the reference only if, on EVERY corpus of CORPORA (HotpotQA's eval split, SQuAD and NQ-open
multi-document QA), it answers right more often: substring EM on the first line, the paired 95 % interval of the
average over gold positions above zero, and below the reference at no gold position. Right answers decide; F1 and
words per answer are reported beside them, and a candidate whose answers run more than half again as long as the
reference's must also not lose F1 (so hedging over several names cannot win by EM). Of the candidates that pass,
the highest average EM wins; if none passes, the baseline stays.

A candidate fails as soon as one corpus it is judged on says so; it passes only when every corpus it is judged on
is measured (until then it is undecided, `decided` False). A trained method is judged only outside its training
data: a corpus its shipped artefact (or a restacked system's scorer's) was trained on, as the artefact's metadata
records, is in-domain for it, reported beside the decision and not in it. A restacked system costs a scoring
prefill per answer, so it must also beat its method alone, paired over the corpora judged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from midlens.core.errors import MidlensError
from midlens.core.method_spec import RESTACK_MARK
from midlens.eval.metrics import bootstrap_ci
from midlens.eval.report.summarise import sweep_summary

CORPORA = ("hotpotqa", "squad", "nq-open")
# The instruction of the plain model as it ships: the reference every candidate is paired with.
REFERENCE_STYLE = "litm"
STYLE_MARK = " @"  # a candidate under another instruction: `finetuned @short`
# Run settings every run the rule reads must share: a pair of rows answered under different ones is no comparison.
# The stop rule is read as "what the metrics read": they read the first line, and --stop-at-line-end stops decoding
# only once that line is complete (greedy decoding: the same line), so a run with it answers as one without.
CONDITIONS = ("model", "max_new_tokens", "max_words", "k", "positions", "examples", "seed", "dtype", "evidence")
LONGER = 1.5  # answers this many times the reference's words must not lose F1 as well


class IncomparableRuns(MidlensError):
    """Runs answered under different conditions: the rule refuses to pair their rows."""


@dataclass
class Verdict:
    method: str
    passes: bool
    average_em: float  # mean over the corpora it is judged on of the method's average EM
    reasons: list[str] = field(default_factory=list)  # why it fails (empty when it passes or is undecided)
    in_domain: list[str] = field(default_factory=list)  # corpora it was trained on: beside the decision
    missing: list[str] = field(default_factory=list)  # corpora it must be judged on and has no rows for

    @property
    def decided(self) -> bool:
        return self.passes or bool(self.reasons)


def check_comparable(configs: list[dict], folders: list[Path] | None = None) -> dict:
    """The conditions the runs share; IncomparableRuns naming the first field on which two runs differ."""
    names = [str(f) for f in folders] if folders else [f"run {i + 1}" for i in range(len(configs))]
    shared: dict = {}
    where: dict[str, str] = {}
    for config, name in zip(configs, names, strict=True):
        for key in CONDITIONS:
            value = config.get(key)
            if key not in shared:
                shared[key], where[key] = value, name
            elif json.dumps(value, sort_keys=True) != json.dumps(shared[key], sort_keys=True):
                raise IncomparableRuns(
                    f"{name} answered with {key}={value!r}, {where[key]} with {key}={shared[key]!r}: the default "
                    "rule pairs rows answered under the same conditions only. Rerun one of them with the other's "
                    f"{key}, or judge them separately."
                )
    return shared


def as_candidates(rows: list[dict]) -> list[dict]:
    """Rows relabelled as candidates: a system answered under another instruction than the reference's becomes
    `METHOD @STYLE`, and its setting the reference's, so each corpus is one table of candidates."""
    out = []
    for r in rows:
        setting = r.get("setting") or {}
        style = setting.get("prompt_style") or REFERENCE_STYLE
        if style != REFERENCE_STYLE:
            method = f"{r['method']}{STYLE_MARK}{style}"
            key = "|".join(method if part == r["method"] else part for part in r["key"].split("|"))
            r = {**r, "method": method, "key": key, "setting": {**setting, "prompt_style": REFERENCE_STYLE}}
        out.append(r)
    return out


def split_candidate(label: str) -> tuple[str, str, str | None]:
    """A candidate's label as (method spec, instruction, restack part or None): what an interface would run."""
    label, _, style = label.partition(STYLE_MARK)
    method, mark, restack = label.partition(RESTACK_MARK)
    return method, style or REFERENCE_STYLE, (restack.removesuffix(")") if mark else None)


def trained_on(method: str, model: str | None) -> frozenset[str]:
    """The corpora (of CORPORA) the shipped artefacts `method` (a candidate's label) reads on `model` were trained
    on, as their metadata's `data` names them; a restacked system's scorer counts too. Empty for a method that trains
    nothing, a label that is no method spec (an ordering), or an unknown model."""
    from midlens.core.errors import MethodConfigError
    from midlens.core.method_spec import split_top_level
    from midlens.core.saved_parts import META
    from midlens.generators.methods.registry import method_config, shipped_artefact_of

    if model is None:
        return frozenset()
    plain, _style, restack = split_candidate(method)
    corpora: set[str] = set()
    for spec in (plain, split_top_level(restack)[0] if restack else ""):
        try:
            folder = shipped_artefact_of(method_config(spec), model) if spec else None
        except MethodConfigError:
            continue
        if folder is not None:
            data = json.dumps(json.loads((folder / META).read_text()).get("data", {})).lower()
            corpora |= {c for c in CORPORA if c in data}
    return frozenset(corpora)


def corpus_tables(rows: list[dict], against: str = "baseline", complete: int | None = None) -> dict[str, dict] | None:
    """One sweep table per corpus measured (candidates labelled by `as_candidates`); None when a corpus was swept
    under two settings (ambiguous) or the reference is missing from a corpus. With `complete`, a corpus whose
    table holds fewer questions answered by every candidate is left out: a sweep is read only when complete."""
    tables: dict[str, dict] = {}
    for label, s in sweep_summary(as_candidates(rows), against).items():
        corpus = next((c for c in CORPORA if label.startswith(c)), None)  # "squad-v2-dev (K=10, ...)" is SQuAD
        if corpus is not None:
            if corpus in tables or against not in s["methods"]:
                return None
            if complete is None or s["n"] >= complete:
                tables[corpus] = s
    return tables


def judge(
    rows: list[dict],
    against: str = "baseline",
    trained: Callable[[str, str | None], frozenset[str]] = trained_on,
    complete: int | None = None,
) -> list[Verdict] | None:
    """A verdict per candidate measured beside `against` (under the reference instruction), best first; None when
    no corpus of CORPORA holds `against`'s rows or a corpus is ambiguous. `trained(method, model)`: the corpora a
    method was trained on (the rows' model; in-domain, beside). `complete`: the questions a corpus must hold for
    every candidate to be read (fewer: it counts as not run)."""
    model = next((r["setting"].get("model") for r in rows if r.get("setting")), None)
    tables = corpus_tables(rows, against, complete)
    if not tables:
        return None
    methods = {m for t in tables.values() for m in t["methods"] if m != against}
    verdicts = []
    for m in methods:
        reasons: list[str] = []
        in_domain = [c for c in CORPORA if c in trained(m, model)]
        outside = [c for c in CORPORA if c not in in_domain]
        if not outside:
            reasons.append(f"trained on {' and '.join(in_domain)}: no corpus outside its training data")
        missing = [c for c in outside if c not in tables or m not in tables[c]["methods"]]
        judged = [c for c in outside if c not in missing]
        for corpus in judged:
            reasons += _corpus_reasons(tables[corpus], m, against, corpus)
        reasons += _restack_reasons(tables, m, judged)
        measured = judged or [c for c in tables if m in tables[c]["methods"]]
        average = sum(tables[c]["methods"][m]["avg"] for c in measured) / len(measured)
        verdicts.append(Verdict(m, not reasons and not missing, average, reasons, in_domain, missing))
    return sorted(verdicts, key=lambda v: (not v.passes, not v.decided, -v.average_em, v.method))


def _corpus_reasons(t: dict, m: str, against: str, corpus: str) -> list[str]:
    """Why `m` fails on one corpus's table (empty: it passes there)."""
    reasons = []
    diff, (low, _high) = t["paired"][m]["em"]
    if not low > 0:
        reasons.append(f"{corpus} EM {100 * diff:+.1f} [{100 * low:+.1f}, ...] not above 0")
    ours, base = t["methods"][m], t["methods"][against]
    if ours["words"] > LONGER * base["words"]:
        f1 = t["paired"][m]["f1"][0]
        if f1 < 0:
            reasons.append(
                f"{corpus} answers {ours['words']:.1f} words against {base['words']:.1f} and F1 {100 * f1:+.1f}: "
                "longer answers that lose F1"
            )
    for p in t["positions"]:
        if ours["positions"][p]["em"] < base["positions"][p]["em"]:
            paired = t["paired"][m].get("em_at", {}).get(p)
            reasons.append(
                f"{corpus} gold@{p} EM {100 * ours['positions'][p]['em']:.1f} below "
                f"{100 * base['positions'][p]['em']:.1f}" + (f" (paired {_points(*paired)})" if paired else "")
            )
    return reasons


def _restack_reasons(tables: dict[str, dict], m: str, judged: list[str]) -> list[str]:
    """A restacked candidate must beat its method alone (paired over the corpora judged): it costs a prefill."""
    plain = m.split(RESTACK_MARK, 1)[0]
    style = m.partition(STYLE_MARK)[2]
    plain = plain if not style or STYLE_MARK in plain else f"{plain}{STYLE_MARK}{style}"
    alone = [c for c in judged if plain in tables[c]["methods"]]
    if plain == m or not alone:
        return []
    diffs = [
        em - tables[c]["methods"][plain]["per_example_em"][e]
        for c in alone
        for e, em in tables[c]["methods"][m]["per_example_em"].items()
    ]
    low, high = bootstrap_ci(diffs)
    if low > 0:
        return []
    mean = 100 * sum(diffs) / len(diffs)
    return [
        f"EM {mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] over {plain} alone on {' and '.join(alone)}, not "
        "above 0 (restacking adds a scoring prefill per answer)"
    ]


def shipped_candidate(model: str) -> str:
    """What every interface runs for `model` where the user names nothing, as a candidate's label: its default
    method's spec, its instruction where it is not the reference's, and its measured restack."""
    from midlens.core.defaults import DEFAULT_PROMPT_STYLE, answer_method_for, measured_restack_for
    from midlens.core.method_spec import restacked_label
    from midlens.generators.methods.registry import method_config

    method = method_config(answer_method_for(model)).spec()
    scorer = measured_restack_for(model, method)
    label = method if scorer is None else restacked_label(method, scorer, 1)
    return label if DEFAULT_PROMPT_STYLE == REFERENCE_STYLE else f"{label}{STYLE_MARK}{DEFAULT_PROMPT_STYLE}"


def judge_runs(folders: list[Path], complete: int | None = None) -> tuple[dict, list[Verdict] | None]:
    """The rule over run folders: the conditions they share (refused where they differ) and the verdicts."""
    from midlens.eval.report.load import load_runs

    configs, rows = load_runs(folders)
    return check_comparable(configs, folders), judge(rows, complete=complete)


def chosen(verdicts: list[Verdict], against: str = "baseline") -> str:
    """The default the verdicts support: the best method that passes, else `against`."""
    return next((v.method for v in verdicts if v.passes), against)


def _named(method: str) -> str:
    """The candidate with the shorthand users know its method by, where it has one: the name the default is
    switched to."""
    from midlens.core.defaults import METHOD_SHORTHANDS

    spec = method.partition(STYLE_MARK)[0].split(RESTACK_MARK, 1)[0]
    known = [f"`{short}`" for short, s in METHOD_SHORTHANDS.items() if s == spec]
    return f"{method} ({', '.join(known)})" if known else method


def corpus_table_lines(corpus: str, t: dict, against: str = "baseline") -> list[str]:
    """One corpus's candidates as a table: EM per gold position, the average with its paired difference, the gap
    (best slot minus worst) and the worst slot, F1 and words beside, and seconds per answer as a ratio to
    `against`'s in the same run."""
    positions = t["positions"]
    head = " / ".join(f"@{p}" for p in positions)
    lines = [
        f"**{corpus}** (n = {t['n']} questions, paired 95 % bootstrap over them):",
        "",
        f"| candidate | EM {head} | avg EM | EM vs {against} | gap | worst | F1 | F1 vs {against} | words | time |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base_seconds = t["methods"][against]["seconds"]
    for m, row in t["methods"].items():
        ems = [100 * row["positions"][p]["em"] for p in positions]
        worst = positions[ems.index(min(ems))]
        paired = t["paired"].get(m)
        em_vs = f1_vs = ""
        if paired:
            em_vs, f1_vs = _points(*paired["em"]), _points(*paired["f1"])
        ratio = row["seconds"] / base_seconds if base_seconds else float("nan")
        lines.append(
            f"| {m} | {' / '.join(f'{e:.1f}' for e in ems)} | {100 * row['avg']:.1f} | {em_vs} | "
            f"{100 * row['gap']:.1f} | @{worst} {min(ems):.1f} | {100 * row['f1']:.1f} | {f1_vs} | "
            f"{row['words']:.1f} | {ratio:.2f}x |"
        )
    slots = [
        f"- {m}: " + ", ".join(f"@{p} {_points(*paired['em_at'][p])}" for p in positions if p in paired["em_at"])
        for m, paired in t["paired"].items()
        if paired.get("em_at")
    ]
    if slots:
        lines += ["", f"EM vs {against} per gold slot, paired over the same questions [95 %]:", "", *slots]
    return [*lines, ""]


def _points(mean: float, interval: tuple[float, float]) -> str:
    """A paired difference in points with its interval: `-0.5 [-5.5, +4.5]`."""
    low, high = interval
    return f"{100 * mean:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def markdown_lines(rows: list[dict], against: str = "baseline", configs: list[dict] | None = None) -> list[str]:
    """The report's section on the rule, or nothing when the rows cannot decide it; runs answered under different
    conditions (`configs`) get a line that says which, instead of a verdict."""
    verdicts = judge(rows, against)
    if verdicts is None:
        return []
    try:
        check_comparable(configs or [])
    except IncomparableRuns as err:
        return ["", "## The answering default these sweeps support", "", f"Not judged: {err}"]
    lines = [
        "",
        "## The answering default these sweeps support",
        "",
        f"Rule: a candidate (method and instruction, as shipped) replaces {against} under the `{REFERENCE_STYLE}` "
        f"instruction only if it answers right more often on every corpus of {', '.join(CORPORA)} (substring EM, "
        "paired 95 % interval above zero), below it at no gold position, and, where its answers run more than "
        f"{LONGER}x as long, without losing F1; a trained method on the corpora outside its training data only; a "
        "restacked system also above its method alone (it costs a prefill more); the best average EM of those "
        f"that pass. **Supported default: {_named(chosen(verdicts, against))}.**",
        "",
    ]
    for corpus, t in (corpus_tables(rows, against) or {}).items():
        lines += corpus_table_lines(corpus, t, against)
    lines += [
        "| candidate | average EM over the corpora judged | in-domain (beside) | verdict | why not |",
        "|---|---|---|---|---|",
    ]
    for v in verdicts:
        verdict = "passes" if v.passes else "fails" if v.reasons else f"undecided: {', '.join(v.missing)} not run"
        beside = ", ".join(v.in_domain) or "-"
        lines.append(f"| {v.method} | {100 * v.average_em:.1f} | {beside} | {verdict} | {'; '.join(v.reasons)} |")
    return lines
