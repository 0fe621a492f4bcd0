"""Retrieval heads: the (layer, head) pairs whose attention lands on the passages that answer (MuDAF, Sec. 3).

Scores are measured by `midlens heads score` (training/heads.py) and ship per model as
`generators/trained/retrieval-heads/<model>.json`: {"f1": [L][H], "em": [L][H], "model_sha256", ...}, a verified JSON
artefact of core.saved_parts (its sha256 recorded in the folder's manifest, checked before the file is read).
Two readers use them: MuDAF picks the heads it tunes (`select_heads`), and evidence can aggregate only the
top heads (`EvidenceConfig(heads="retrieval")`, resolved here by `retrieval_heads`).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

from midlens.core.errors import ArtefactError, Step
from midlens.core.saved_parts import json_artefacts, read_json_artefact
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.generators.models.loading import LoadedModel
from midlens.generators.models.shipped import SHIPPED as TRAINED

SHIPPED = TRAINED / "retrieval-heads"
TOP_FRACTION = 0.05  # MuDAF's "retrieval heads": the top 5 % of heads


def select_heads(
    scores: list[list[float]],
    count: int = 8,
    seed: int = 0,
    mode: str = "sample",
    temperature: float = 0.05,
    tiebreak: list[list[float]] | None = None,
) -> list[tuple[int, int]]:
    """`count` distinct (layer, head) pairs: sampled with P(h) ~ exp(R_h / temperature) (the paper), or the top
    (ties broken by `tiebreak`, e.g. the EM scores, then by position)."""
    flat = [(score, (layer, head)) for layer, row in enumerate(scores) for head, score in enumerate(row)]
    if mode == "top":
        second = (lambda h: tiebreak[h[0]][h[1]]) if tiebreak else (lambda h: 0.0)
        return sorted(h for _, h in sorted(flat, key=lambda x: (-x[0], -second(x[1]), x[1]))[:count])
    if mode != "sample":
        raise ValueError(f"head selection mode={mode!r}: expected 'sample' or 'top'.")
    rng = random.Random(seed)
    pool = list(flat)
    chosen = []
    top = max(s for s, _ in pool)
    for _ in range(min(count, len(pool))):
        weights = [math.exp((s - top) / temperature) for s, _ in pool]  # shifted: no overflow
        i = rng.choices(range(len(pool)), weights=weights)[0]
        chosen.append(pool.pop(i)[1])
    return sorted(chosen)


def top_heads(scores: dict, fraction: float = TOP_FRACTION) -> list[tuple[int, int]]:
    """The top `fraction` of all heads (at least one) by F1, ties by EM: F1 is sparse on small models."""
    f1 = scores["f1"]
    count = max(1, round(fraction * sum(len(row) for row in f1)))
    return select_heads(f1, count, mode="top", tiebreak=scores.get("em"))


def score_heads(model: str, out: Path) -> Step:
    """The step that writes a model's retrieval-head scores."""
    return Step(
        "heads-score",
        f"score {model}'s retrieval heads into {out} (midlens.training.heads.retrieval_head_scores, then save_scores)",
        {"model": model, "out": str(out)},
    )


def load_scores(loaded: LoadedModel, path: str | Path | None = None) -> dict:
    """The score file for `loaded` (the shipped one by default), checked against the model it claims to score."""
    path = Path(path) if path is not None else SHIPPED / f"{loaded.name}.json"
    if not path.is_file():
        shipped = sorted(p.stem for p in json_artefacts(SHIPPED))
        raise ArtefactError(
            f"no retrieval-head scores for model {loaded.name!r} at {path} (shipped: {', '.join(shipped) or 'none'}).",
            [score_heads(loaded.name, path.parent)],
        )
    rescore = [score_heads(loaded.name, path.parent)]
    scores = read_json_artefact(path, "retrieval-head score file", steps=rescore)  # verified by its recorded sha256
    try:
        f1 = scores["f1"]
    except KeyError as err:
        raise ArtefactError(f"{path}: not a retrieval-head score file ({err}).", rescore) from None
    if scores.get("model_sha256") != loaded.sha256:
        raise ArtefactError(
            f"{path} scores another model (sha256 {str(scores.get('model_sha256'))[:12]}...) than {loaded.name} "
            f"({loaded.sha256[:12]}...).",
            [score_heads(loaded.name, path.parent)],
        )
    config = loaded.model.config
    if len(f1) != config.num_hidden_layers or any(len(row) != config.num_attention_heads for row in f1):
        shape = f"[layers={config.num_hidden_layers}][heads={config.num_attention_heads}]"
        raise ArtefactError(f"{path}: scores are not {shape} as {loaded.name} has; recompute them.")
    return scores


def retrieval_heads(loaded: LoadedModel, path: str | Path | None = None) -> tuple[tuple[int, int], ...]:
    """The model's top retrieval heads as (layer, head) pairs."""
    return tuple(top_heads(load_scores(loaded, path)))


def resolve_evidence(config: EvidenceConfig, loaded: LoadedModel) -> EvidenceConfig:
    """heads="retrieval" -> the model's top retrieval heads as (layer, head) pairs; any other config unchanged."""
    if config.heads != "retrieval":
        return config
    return replace(config, heads=retrieval_heads(loaded))
