"""The report's PNG plots: accuracy and evidence rank against gold position, and reranker recall."""

from __future__ import annotations

import io
from pathlib import Path

from midlens.eval.report.summarise import RANKERS, rerank_summary, sweep_summary
from midlens.eval.runner import write_atomic


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buf.getvalue())


def plots(rows: list[dict], out: Path) -> list[Path]:
    """The plots of the sweep and rerank rows, written to `out`; their paths, in the order report.md shows them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    sweeps = sweep_summary(rows)
    for metric, label, fname in (
        ("em", "accuracy (%)", "accuracy_vs_position.png"),
        ("gold_rank", "gold evidence rank (1 = top)", "evidence_rank_vs_position.png"),
    ):
        if not sweeps:
            break
        fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 3.6), squeeze=False)
        for ax, (ds, s) in zip(axes[0], sweeps.items(), strict=True):
            for m, t in s["methods"].items():
                ys = [t["positions"][p][metric] * (100 if metric == "em" else 1) for p in s["positions"]]
                line = ax.plot(s["positions"], ys, marker="o", label=m)[0]
                if metric == "em":  # 95 % bootstrap band: differences inside it are noise at this n
                    lo = [100 * t["positions"][p]["em_ci"][0] for p in s["positions"]]
                    hi = [100 * t["positions"][p]["em_ci"][1] for p in s["positions"]]
                    ax.fill_between(s["positions"], lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
            ax.set(title=f"{ds}, n={s['n']}", xlabel="gold position", ylabel=label, xticks=s["positions"])
            if metric == "gold_rank":
                ax.invert_yaxis()
            ax.legend(fontsize=8)
        _save(fig, out / fname)
        plt.close(fig)
        written.append(out / fname)
    reranks = rerank_summary(rows)
    if reranks:
        fig, axes = plt.subplots(1, len(reranks), figsize=(6 * len(reranks), 3.6), squeeze=False)
        for ax, ((ds, method), s) in zip(axes[0], reranks.items(), strict=True):
            ks = ["recall@1", "recall@2", "recall@5"]
            width = 0.8 / len(RANKERS)
            for i, name in enumerate(RANKERS):
                vals = [s["rankers"][name][k] for k in ks]
                err = [
                    [v - s["ci"][name][k][0] for v, k in zip(vals, ks, strict=True)],
                    [s["ci"][name][k][1] - v for v, k in zip(vals, ks, strict=True)],
                ]
                ax.bar([j + i * width for j in range(len(ks))], vals, width, yerr=err, capsize=2, label=name)
            ax.set(title=f"{ds} ({method}), n={s['n']}", ylabel="recall", ylim=(0, 1))
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], ks)
            ax.legend(fontsize=8)
        _save(fig, out / "reranker_recall.png")
        plt.close(fig)
        written.append(out / "reranker_recall.png")
    return written
