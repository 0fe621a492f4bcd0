"""An answer's wire form: the JSON `midlens serve` sends of an Answer and every client reads back, written and read
here only.

The server's answers (`/v1/midlens/answer`, the `midlens` object of a chat completion and of `/v1/midlens/score`), the
LlamaIndex responses built from a local Answer and those rebuilt from a server's reply all go through these functions,
so a field added to the answer travels everywhere or nowhere. `rag.remote.MidlensResult` declares the same keys for
the server's validation and OpenAPI schema (tests/test_answer_wire.py holds the two to each other).

The wire form is what a client can use, not the whole in-process record (`Answer.to_dict` is that): each passage is
an evidence row naming it by id and title, not its text (the client sent the passages: `answer_from_wire` takes them
back), with its `score` (what `rank` orders by) beside the columns it comes from; `evidence` repeats those scores in
prompt order; the dropped passages are their ids; `withheld` is the withheld answer's text. Not on the wire, so
rebuilt as defaults: the tokens, their log-probabilities and margins, the raw attention maps and the method's scratch
state (tensors and per-token detail a client has no use for), each passage's token span and `layers_seen`, the
withheld answer's citations, and `checked` (the endpoint a client called says it: `/v1/midlens/check`).

Every value is JSON-native (lists, not tuples), so a wire dict equals its own `json.loads(json.dumps(...))`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from midlens.core.passage import Passage
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.citations import Citation, CitedSource
from midlens.generators.answering.support import Support
from midlens.generators.attention.evidence import EvidenceConfig, PassageEvidence

# The keys of an answer's wire dict, in the order the server sends them (after `question` and `text`, those of
# rag.remote.MidlensResult, less the server's own `batch_size`).
ANSWER_KEYS = (
    "question",
    "text",
    "model",
    "method",
    "evidence_config",
    "passages",
    "evidence",
    "dropped",
    "prompt_tokens",
    "generated_tokens",
    "timings",
    "citations",
    "restack",
    "support",
    "withheld",
)
# The keys of one passage's evidence row (rag.remote.EvidenceRow).
PASSAGE_KEYS = (
    "id",
    "title",
    "position",
    "retrieval_score",
    "evidence",
    "calibrated",
    "answer_attribution",
    "rank",
    "score",
)


def _plain(value: Any) -> Any:
    """`value` with every tuple a list and every mapping a new dict: what JSON gives back for it."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _pair(value: Sequence[int] | None) -> tuple[int, int] | None:
    return None if value is None else (int(value[0]), int(value[1]))


def passage_to_wire(evidence: PassageEvidence) -> dict[str, Any]:
    """One passage's evidence row: the passage named by id and title (the client holds its text), where the prompt
    held it, its scores, its rank and `score`, the one `rank` orders by (calibrated when computed, else raw)."""
    return {
        "id": evidence.passage.id,
        "title": evidence.passage.title,
        "position": evidence.position,
        "retrieval_score": evidence.retrieval_score,
        "evidence": evidence.evidence,
        "calibrated": evidence.calibrated,
        "answer_attribution": evidence.answer_attribution,
        "rank": evidence.rank,
        "score": evidence.score,
    }


def passage_from_wire(row: Mapping[str, Any], passage: Passage | None = None) -> PassageEvidence:
    """The PassageEvidence of an evidence row, about `passage` (the one the client sent at that position); without
    it, a passage of the row's id and title, its text unknown. `score` is derived, so it is not read back."""
    if passage is None:
        passage = Passage("", row["title"], row["id"])
    return PassageEvidence(
        position=row["position"],
        passage=passage,
        retrieval_score=row["retrieval_score"],
        evidence=row["evidence"],
        calibrated=row["calibrated"],
        answer_attribution=row["answer_attribution"],
        rank=row["rank"],
    )


def citation_to_wire(citation: Citation) -> dict[str, Any]:
    """One answer sentence's citation: its span and tokens, and each cited source (every CitedSource field, so a
    field added there travels); also what a streamed chat completion sends as `midlens_citation`."""
    return _plain(dataclasses.asdict(citation))


def citation_from_wire(record: Mapping[str, Any]) -> Citation:
    """The Citation `citation_to_wire` wrote, its spans tuples again as the library holds them."""
    sources = [
        CitedSource(**{**source, "sentence": _pair(source.get("sentence"))}) for source in record.get("sources", [])
    ]
    return Citation(span=_pair(record["span"]), tokens=_pair(record["tokens"]), sources=sources)


def evidence_config_from_wire(data: Mapping[str, Any]) -> EvidenceConfig:
    """The EvidenceConfig a wire dict spells: JSON has no tuples, and EvidenceConfig spells head lists as tuples."""
    config = dict(data)
    if isinstance(config.get("heads"), list):
        config["heads"] = tuple(tuple(h) if isinstance(h, list) else h for h in config["heads"])
    return EvidenceConfig(**config)


def answer_to_wire(answer: Answer) -> dict[str, Any]:
    """The answer as the server sends it (ANSWER_KEYS, JSON-native): the one place its wire dict is written, so the
    server's responses and the LlamaIndex responses built from a local answer carry the same fields and values."""
    rows = [passage_to_wire(pe) for pe in answer.passages]
    return {
        "question": answer.question,
        "text": answer.text,
        "model": answer.model,
        "method": _plain(answer.method),
        "evidence_config": _plain(dataclasses.asdict(answer.evidence_config)),
        "passages": rows,
        "evidence": [row["score"] for row in rows],
        "dropped": [p.id for p in answer.dropped],
        "prompt_tokens": answer.prompt_tokens,
        "generated_tokens": answer.generated_tokens,
        "timings": dict(answer.timings),
        "citations": [citation_to_wire(c) for c in answer.citations],
        "restack": _plain(answer.restack),
        "support": None if answer.support is None else _plain(answer.support.to_dict()),
        "withheld": None if answer.withheld is None else answer.withheld["text"],
    }


def answer_from_wire(
    data: Mapping[str, Any],
    passages: Sequence[Passage] = (),
    *,
    question: str | None = None,
    text: str | None = None,
    checked: bool = False,
) -> Answer:
    """The Answer a wire dict (`answer_to_wire`'s, a server's response) holds: the one place it is read back.

    `passages`: those the client sent, in the order sent; each evidence row's passage is the one at its position
    (their text is not on the wire), and those past the rows (dropped by truncate="drop_last") are the dropped ones.
    Without them, passages of the rows' and the dropped ids' ids and titles stand in. `question` and `text`: for a
    wire dict without them (the `midlens` object of a chat completion, whose question and text the messages hold);
    `checked`: an answer of `/v1/midlens/check`, which the wire does not say. Extra keys (`batch_size`) are ignored."""
    sent = list(passages)
    rows = data["passages"]
    evidence = [
        passage_from_wire(row, sent[row["position"] - 1] if row["position"] <= len(sent) else None) for row in rows
    ]
    left = sent[len(rows) :]
    dropped = [left[i] if i < len(left) else Passage("", id=passage_id) for i, passage_id in enumerate(data["dropped"])]
    withheld = data.get("withheld")
    support = data.get("support")
    return Answer(
        question=data["question"] if question is None else question,
        text=data["text"] if text is None else text,
        passages=evidence,
        model=data["model"],
        method=dict(data["method"]),
        evidence_config=evidence_config_from_wire(data["evidence_config"]),
        prompt_tokens=data["prompt_tokens"],
        generated_tokens=data["generated_tokens"],
        timings=dict(data["timings"]),
        dropped=dropped,
        citations=[citation_from_wire(c) for c in data.get("citations") or []],
        restack=data.get("restack"),
        support=None if support is None else Support.from_dict(support),
        withheld=None if withheld is None else {"text": withheld, "citations": []},
        checked=checked,
    )
