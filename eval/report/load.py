"""The rows of one or more run directories, each with its run's setting, and methods labelled by their options."""

from __future__ import annotations

import json
from pathlib import Path

from midlens.eval.runner import CONFIG, RunError, read_rows

# Config entries that change a unit's result beyond what its key names (example, method, position).
SETTINGS = ("model", "max_new_tokens", "max_words", "evidence", "logprob", "top_k", "prompt_style", "retrieval")


def load_runs(run_dirs: list[Path]) -> tuple[list[dict], list[dict]]:
    """Configs and rows of the runs; each row gets its run's "setting". A unit present in several runs
    under the same setting (the same work done twice, or shard files next to their merge) counts once."""
    configs, rows = [], {}
    for run in map(Path, run_dirs):
        if not (run / CONFIG).is_file():
            raise RunError(
                f"{run} is not a run directory (no {CONFIG}); give the folder `midlens eval sweep|rerank|e2e` wrote."
            )
        config = json.loads((run / CONFIG).read_text())
        configs.append(config)
        setting = {k: config.get(k) for k in SETTINGS}
        setting["prompt_style"] = setting["prompt_style"] or "litm"  # runs from before the option used Liu et al.'s
        if config.get("kind") == "e2e":
            setting["retrieval"] = setting["retrieval"] or "dense"  # e2e runs from before the option were dense
        labels = {m: method_label(m, c) for m, c in config.get("methods", {}).items()}
        for f in sorted([*run.glob("results*.jsonl"), *run.glob("results*.jsonl.gz")]):
            for row in read_rows(f):
                label = labels.get(row["method"], row["method"])
                key = "|".join(label if part == row["method"] else part for part in row["key"].split("|"))
                row = {**row, "key": key, "method": label, "setting": setting}
                rows[(json.dumps(setting, sort_keys=True), key)] = row
    return configs, list(rows.values())


def method_label(key: str, recorded: dict) -> str:
    """What a run's method is called in tables: the spec of the options it ran with, against today's defaults.

    A run names its methods as they were typed (`attn-calibration`), and a default can change later (strength 1.0
    became 0.5): labelled by the recorded options, two runs of one name under different defaults stay apart and
    an old run reads `attn-calibration(strength=1.0)`. Orderings (lcr, attn-sort) keep their own name; a restacked
    system is its method's label and `+restack(SCORER)` (`, rounds=N` past one round).
    """
    if recorded.get("ordering"):
        return key
    restack = recorded.get("restack")
    if restack:
        from midlens.core.method_spec import RESTACK_MARK, restacked_label

        base = {k: v for k, v in recorded.items() if k != "restack"}
        return restacked_label(
            method_label(key.split(RESTACK_MARK, 1)[0], base),
            restack["scorer"],
            restack["rounds"],
            restack.get("slots", "measured"),
        )
    name = recorded.get("name", key)
    options = {k: v for k, v in recorded.items() if k not in ("name", "ordering")}
    if not options:  # nothing to compare with the defaults (the baseline): the registry, and torch, stay unloaded
        return name
    # Today's defaults are only known to the method registry (each method module holds its own).
    from midlens.generators.methods.registry import MethodConfig

    return MethodConfig(name, options).spec()
