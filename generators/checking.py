"""Which sentences of a checked answer (`Generator.attribute`) may not rest on the passages, read from its citations:
with no support model for answers this model did not write, the per-sentence verdict is the ablation's."""

from __future__ import annotations

from midlens.generators.answer import Answer
from midlens.generators.citations import Citation

NO_SUPPORT_MODEL = (
    "no support model for checked answers yet: the generation-time one reads this model's confidence in tokens it "
    "picked, which a given answer's were not"
)


def verified(answer: Answer) -> bool:
    """Whether the answer's citations were checked by ablation (`Generator.verify`)."""
    return any(s.verified is not None for c in answer.citations for s in c.sources)


def unsupported(answer: Answer) -> list[Citation]:
    """The sentences that may not be supported: those citing no passage and, once verified, those none of whose
    cited passages the sentence needed (attention always lands somewhere, so unverified citations flag little)."""
    check = verified(answer)
    return [c for c in answer.citations if not c.sources or (check and not any(s.verified for s in c.sources))]


def supported_share(answer: Answer) -> float | None:
    """The share of the answer's sentences that rest on a passage (verified ones once checked); None without
    sentences. A count, not a calibrated probability."""
    if not answer.citations:
        return None
    return 1 - len(unsupported(answer)) / len(answer.citations)
