"""Evidence results: per-passage attention scores and how they are aggregated (the answer record:
generators.answering.answer).

The generator hands over raw maps, attention mass per (layer, head, passage) for each scoring query:
  last      the last prompt token (what the model "looks at" just before answering);
  question  mean over the question's tokens (ICR, arXiv 2410.02642);
  answer    mean over the generated tokens (attribution of the answer);
  and the same `last`/`question` maps for a content-free query ("N/A") when calibration ran.
`EvidenceConfig` picks the query, layers and heads; a passage's score is the mean over the chosen
layers and heads of the attention mass it receives. Calibrated = score(query) - score("N/A").
heads="retrieval" keeps only the model's top retrieval heads (generators/methods/retrieval_heads.py); the
generator resolves it to (layer, head) pairs, and the layers to theirs, when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from midlens.core.errors import InvalidArgumentError
from midlens.core.passage import Passage

LayerSpec = Literal["all", "upper", "lower"] | list[int]
# "all"; "retrieval" (resolved by the generator); head indices within the chosen layers; or (layer, head) pairs.
HeadSpec = Literal["all", "retrieval"] | tuple[int, ...] | tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class EvidenceConfig:
    """Which query, layers and heads evidence reads. The default (the question's tokens, the upper half of the
    layers, every head) is resolved per model by `for_windows`: on a model with sliding windows it reads the global
    layers instead, the only ones that see every passage. Any other config is used as given."""

    query: Literal["last", "question"] = "question"
    layers: LayerSpec = "upper"
    heads: HeadSpec = "all"

    @classmethod
    def from_text(cls, layers: str = "upper", query: str = "question", heads: str = "all") -> EvidenceConfig:
        """The config a command line or a form spells as text: layers `all | upper | lower | 20,21,22`, query
        `last | question`, heads `all | retrieval`. Each value is refused here, naming what is accepted."""
        parsed: LayerSpec = layers  # type: ignore[assignment]
        if layers not in ("all", "upper", "lower"):
            try:
                parsed = [int(x) for x in layers.split(",")]
            except ValueError:
                raise InvalidArgumentError(
                    f"evidence layers {layers!r}: use all, upper, lower or e.g. 20,21,22."
                ) from None
        if query not in ("last", "question"):
            raise InvalidArgumentError(f"evidence query {query!r}: use last or question.")
        if heads not in ("all", "retrieval"):
            raise InvalidArgumentError(f"evidence heads {heads!r}: use all or retrieval.")
        return cls(query=query, layers=parsed, heads=heads)  # type: ignore[arg-type]

    @property
    def head_pairs(self) -> tuple[tuple[int, int], ...] | None:
        """The (layer, head) pairs when heads are given that way (they override `layers`), else None."""
        if isinstance(self.heads, tuple) and self.heads and isinstance(self.heads[0], tuple | list):
            return tuple((int(layer), int(head)) for layer, head in self.heads)
        return None

    def layer_indices(self, num_layers: int) -> list[int]:
        pairs = self.head_pairs
        if pairs is not None:
            bad = sorted({layer for layer, _ in pairs if not 0 <= layer < num_layers})
            if bad:
                raise ValueError(f"evidence heads in layers {bad}: the model has layers 0..{num_layers - 1}.")
            return sorted({layer for layer, _ in pairs})
        if self.layers == "all":
            return list(range(num_layers))
        if self.layers == "upper":
            return list(range(num_layers // 2, num_layers))
        if self.layers == "lower":
            return list(range(num_layers // 2))
        bad = [i for i in self.layers if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"evidence layers {bad} out of range: the model has layers 0..{num_layers - 1}.")
        return list(self.layers)


def for_windows(config: EvidenceConfig, windows: list[int | None]) -> EvidenceConfig:
    """The default config on a model with sliding windows (`windows` per layer, None: sees the whole prompt) -> its
    global layers. From the question's tokens of a prompt longer than the window, the windowed layers see only the
    last passages, and a passage they cannot reach averages their zeros in: on gemma3-270m (HotpotQA, 10 passages,
    ~1.4k tokens, train split) the gold passage's mean evidence rank was 5.9 / 3.7 / 1.6 at slots 1 / 5 / 10 with the
    upper half, 4.4 / 3.1 / 1.5 with the global layers, the best of the rules measured
    (docs/results/gemma3-270m/windowed-evidence). Any other config, or a model without windows: unchanged."""
    if config != EvidenceConfig() or not any(windows):
        return config
    global_layers = [i for i, window in enumerate(windows) if window is None]
    if not global_layers:  # every layer windowed (Mistral 7B v0.1): no layer sees every passage; keep the default
        return config
    return replace(config, layers=global_layers)


def aggregate(maps: torch.Tensor, config: EvidenceConfig) -> list[float]:
    """[layers, heads, passages] attention mass -> one score per passage."""
    pairs = config.head_pairs
    if pairs is not None:
        return torch.stack([maps[layer, head] for layer, head in pairs]).mean(dim=0).tolist()
    if config.heads == "retrieval":
        raise ValueError('heads="retrieval" is resolved to (layer, head) pairs by the Generator; aggregate those.')
    layers = config.layer_indices(maps.shape[0])
    selected = maps[layers]
    if config.heads != "all":
        selected = selected[:, list(config.heads)]
    return selected.mean(dim=(0, 1)).tolist()


@dataclass
class RowMaps:
    """(last, question) maps [layers, heads, passages] of one row, read from one pass."""

    last: torch.Tensor
    question: torch.Tensor


@dataclass
class EvidenceMaps:
    """Raw attention mass, each [layers, heads, passages] (batch of one)."""

    last: torch.Tensor
    question: torch.Tensor
    answer: torch.Tensor | None = None
    null_last: torch.Tensor | None = None
    null_question: torch.Tensor | None = None

    def scores(self, config: EvidenceConfig) -> list[float]:
        return aggregate(getattr(self, config.query), config)

    def calibrated(self, config: EvidenceConfig) -> list[float] | None:
        null = self.null_last if config.query == "last" else self.null_question
        if null is None:
            return None
        return [a - b for a, b in zip(self.scores(config), aggregate(null, config), strict=True)]

    def attribution(self, config: EvidenceConfig) -> list[float] | None:
        return None if self.answer is None else aggregate(self.answer, config)


@dataclass
class PassageEvidence:
    """One passage as the model saw it: prompt position (1-based) and the scores it earned."""

    position: int
    passage: Passage
    retrieval_score: float | None
    evidence: float
    calibrated: float | None
    answer_attribution: float | None
    rank: int  # 1 = strongest evidence (calibrated when available, else raw)
    span: tuple[int, int] | None = None  # the passage's tokens in the prompt, [start, end)
    # On a model with sliding windows: the aggregated layers whose window reached the passage from the evidence's own
    # query (for "question", from the question's first token, the one that reaches furthest back; for "last", from
    # the prompt's last token). A layer it did not reach gave it no attention at all. None on models whose every
    # layer sees the whole prompt.
    layers_seen: list[int] | None = None

    @property
    def score(self) -> float:
        """The passage's evidence as the ranking uses it: calibrated when it was computed, else raw."""
        return self.calibrated if self.calibrated is not None else self.evidence


def layers_reaching(
    span: tuple[int, int], query_column: int, windows: list[int | None], layers: list[int]
) -> list[int]:
    """The `layers` whose sliding window (None: none) lets the query at `query_column` see a key of `span`."""
    return [i for i in layers if windows[i] is None or query_column - (span[1] - 1) < windows[i]]


def query_column(config: EvidenceConfig, prompt_tokens: int, question_span: tuple[int, int] | None) -> int:
    """The prompt column of the evidence query's earliest token: the question's first token for "question" (the
    mean over the question's tokens holds the mass of any token that saw a key), else the prompt's last token."""
    if config.query == "question" and question_span is not None and question_span[1] > question_span[0]:
        return question_span[0]
    return prompt_tokens - 1


def passage_evidence(
    passages: list[Passage],
    maps: EvidenceMaps,
    config: EvidenceConfig,
    spans: list[tuple[int, int]] | None = None,
    windows: list[int | None] | None = None,
    prompt_tokens: int | None = None,
    question_span: tuple[int, int] | None = None,
) -> list[PassageEvidence]:
    """`windows` (per layer), `prompt_tokens` and `question_span`, on a model with sliding windows: fill
    `layers_seen` for the config's query."""
    seen: list[list[int] | None] = [None] * len(passages)
    if windows is not None and any(windows) and spans is not None and prompt_tokens is not None:
        layers = config.layer_indices(len(windows))  # the aggregated layers, (layer, head) pairs' included
        column = query_column(config, prompt_tokens, question_span)
        seen = [layers_reaching(tuple(span), column, windows, layers) for span in spans]
    raw = maps.scores(config)
    calibrated = maps.calibrated(config)
    attribution = maps.attribution(config)
    key = calibrated if calibrated is not None else raw  # what PassageEvidence.score is
    order = sorted(range(len(passages)), key=lambda i: -key[i])
    rank = {i: r + 1 for r, i in enumerate(order)}
    return [
        PassageEvidence(
            position=i + 1,
            passage=p,
            retrieval_score=p.score,
            evidence=raw[i],
            calibrated=None if calibrated is None else calibrated[i],
            answer_attribution=None if attribution is None else attribution[i],
            rank=rank[i],
            span=None if spans is None else tuple(spans[i]),
            layers_seen=seen[i],
        )
        for i, p in enumerate(passages)
    ]
