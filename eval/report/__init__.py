"""`midlens eval report`: markdown tables and PNG plots from one or more run directories.

- load: the runs' rows, each with its setting; methods labelled by the options they ran with;
- groups: which rows make one table and what it is called (settings are never pooled);
- summarise: means with bootstrap intervals, and paired differences on the same questions;
- render: report.md's tables; plots: the PNGs.
"""

from __future__ import annotations

from pathlib import Path

from midlens.core.errors import Remedy
from midlens.eval.report.cite import cite_markdown
from midlens.eval.report.groups import method_order
from midlens.eval.report.load import load_runs
from midlens.eval.report.plots import plots
from midlens.eval.report.render import markdown
from midlens.eval.runner import RunError, write_atomic

__all__ = ["write_report"]


def write_report(run_dirs: list[Path], out: Path, against: str | None = None) -> Path:
    """report.md and its PNGs in `out`. Paired tables subtract method `against`, named as the tables label it;
    None: the baseline, where the runs have one."""
    configs, rows = load_runs(run_dirs)
    if not rows:
        raise RunError(f"no results yet in {', '.join(map(str, run_dirs))}.")
    methods = sorted({r["method"] for r in rows if r["kind"] in ("sweep", "rerank")}, key=method_order)
    if against is not None and against not in methods:
        raise RunError(
            f"no sweep or rerank rows of that method in these runs; choose one of {', '.join(methods) or '(none)'}.",
            about=Remedy("against", against),
        )
    against = against or "baseline"
    out = Path(out)
    text = markdown(configs, rows, against)
    text += cite_markdown(configs, rows, run_dirs)
    pngs = plots(rows, out)
    text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in pngs) + "\n"
    write_atomic(out / "report.md", text)
    return out / "report.md"
