"""The unit every layer passes around: one retrieved piece of text."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Passage:
    """One retrieved unit of text. `score` is the retriever's similarity (None when not retrieved)."""

    text: str
    title: str = ""
    id: str = ""
    score: float | None = None
    metadata: dict = field(default_factory=dict)
