"""The answer record: what one generated answer holds (its text, every passage's evidence, its citations and support,
timings, and what a restack or an abstention changed), as `Generator`, `Pipeline` and every interface return it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from midlens.core.passage import Passage
from midlens.generators.attention.evidence import EvidenceConfig, EvidenceMaps, PassageEvidence

if TYPE_CHECKING:
    from midlens.generators.answering.support import Support


@dataclass
class Answer:
    question: str
    text: str
    passages: list[PassageEvidence]
    model: str
    method: dict
    evidence_config: EvidenceConfig
    prompt_tokens: int
    generated_tokens: int
    timings: dict[str, float]
    dropped: list[Passage] = field(default_factory=list)
    maps: EvidenceMaps | None = field(default=None, repr=False)
    reference_logprob: float | None = None  # log p(reference answer | prompt), when one was given
    # What the method's answering hook kept for this row (its scratch state, e.g. attn-calibration's bias maps).
    method_state: dict = field(default_factory=dict, repr=False)
    # Per answer sentence: its characters in `text` and the passages (and their sentences) it rests on
    # (generators.answering.citations.Citation); empty when citations are off or there is nothing to cite.
    citations: list = field(default_factory=list)
    reference_token_logprobs: list[float] | None = field(default=None, repr=False)  # per token of the reference
    answer_ids: list[int] = field(default_factory=list, repr=False)  # the generated tokens, as decoded into `text`
    token_logprobs: list[float] = field(default_factory=list, repr=False)  # each of `answer_ids` when it was picked
    token_margins: list[float] = field(default_factory=list, repr=False)  # top-1 minus top-2 log-prob at each step
    # When the passages were restacked before answering (generators.answering.restack): the scorer, the rounds, the
    # slots and the order the prompt held them in; `passages` and `citations` are then numbered as the caller gave them.
    restack: dict | None = None
    # How far the answer can be trusted (generators.answering.support): a calibrated probability that it is right, read
    # from this pass (and from the verification's ablation drops once `verify` ran); None with citations off.
    support: Support | None = None
    # When the caller asked to abstain below the support threshold and this answer fell below it: the answer and
    # citations that were withheld (`text` then says the passages did not support an answer).
    withheld: dict | None = None
    # The answer was given, not generated (`Generator.attribute`): its tokens were teacher-forced, so the confidence
    # features a support model reads (log-probabilities, margins of tokens this model did not pick) mean something
    # else, and the generation-time support model is not applied to it.
    checked: bool = False

    def ranked(self) -> list[PassageEvidence]:
        return sorted(self.passages, key=lambda p: p.rank)

    def to_dict(self) -> dict:
        """The in-process record (`midlens ask --json`, a LlamaIndex response's `raw`): every field but the tensors
        and per-token detail, each passage whole. Not the wire form a server sends and a client reads back, which
        names passages by id: generators.answering.answer_wire writes and reads that."""
        out = asdict(self)
        out.pop("maps")
        out.pop("method_state")  # tensors a method kept for itself: not part of the record
        out.pop("answer_ids")
        out.pop("reference_token_logprobs")
        out.pop("token_logprobs")
        out.pop("token_margins")
        out["support"] = None if self.support is None else self.support.to_dict()
        return out
