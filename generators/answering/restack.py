"""Evidence-guided restacking: score the passages with a method's evidence, put the strongest where the model reads
best, then answer with any method.

    restacker = Restacker(Generator("smollm2-135m"), Restack("mudaf"))      # MuDAF's delta scores, baseline answers
    answer = restacker.generate(restacker.prompt(question, passages))
    answer.passages[0].position == 1                                       # numbered as the caller stacked them
    answer.restack["order"]                                                # what the prompt held, slot by slot

One scoring pass (`Generator.score_batch` with the scorer's method: a prefill and the content-free question, no
decoding) gives each passage its calibrated evidence; passages are then placed strongest first into the model's
slots ranked best first, and the answering generator answers the restacked prompt. With `rounds` > 1 the scorer
reads the restacked prompt again and the passages are placed again from the new scores (attention sorting is
iterative, Peysakhovich & Lerer 2023; a one-pass sort can trail the iterated one by a wide margin). Batches stay
batches: a batch's prompts are scored in one `score_batch` per round and answered in one `generate_batch`.

Which slots a model reads best is measured, not assumed: a position sweep over every slot on HotpotQA's train
split ranks them by accuracy (EM, then F1, then the gold answer's log-probability) and the order ships per
packaged model and answering method in `generators/trained/slot-orders/` (made by eval.slots; each file names the
model and the method that answered, and is a verified JSON artefact of core.saved_parts, its sha256 recorded in the
folder's manifest). Training moves where a model reads best (SmolLM2's fine-tune reads the first slot best, its base
model the last), so the answering generator's own order is used where one was measured, else its base model's
(`Answer.restack["slot_order"]` names the file). A prompt with another number of passages than the
sweep's K reads the measured slot at the same relative depth.

Whether an interface restacks where its caller does not say is measured too: its `restack` option defaults to
"measured" (rag.options.AnswerOptions.resolve turns it into the Restack core.defaults.MEASURED_RESTACKS names for the
answering model and method, or None where restacking was not measured to help).

The answer comes back in the caller's numbering: `Answer.passages` in the order given, each `position` the one the
caller gave it, citations' `position`s likewise; the raw maps are permuted the same way. `Answer.restack` says
what the prompt held; a passage's `span` stays its tokens in the prompt as answered.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from midlens.core.defaults import DEFAULT_RESTACK_SCORER
from midlens.core.errors import ArtefactError, InvalidArgumentError, MethodConfigError, Remedy, Step
from midlens.core.method_spec import parse_scorer_spec, restacked_label
from midlens.core.saved_parts import json_artefacts, read_json_artefact
from midlens.core.validation import check_restack_rounds
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.citations import Citation
from midlens.generators.answering.generator import GenerationStream, Generator
from midlens.generators.attention.evidence import PassageEvidence
from midlens.generators.methods.registry import MethodConfig, method_config
from midlens.generators.models.prompt import StackedPrompt, render
from midlens.generators.models.shipped import SHIPPED as TRAINED

SHIPPED = TRAINED / "slot-orders"
STRONGEST_FIRST = "first"  # core.defaults.SLOT_POLICIES: the slot policy that needs no measured order
STRONGEST_FIRST_SOURCE = "strongest-first"  # what its SlotOrder (and Answer.restack["slot_order"]) says
STRONGEST_LAST = "last"  # core.defaults.SLOT_POLICIES: the strongest passage nearest the question, no measurement
STRONGEST_LAST_SOURCE = "strongest-last"
READ_SLOTS = "read"  # core.defaults.SLOT_POLICIES: the order read per prompt from its content-free evidence
READ_SOURCE = "read-from-evidence"
# Orders that are not a measured table: a rule at every passage count (reversed for "last"), not a relative depth.
_UNMEASURED = (STRONGEST_FIRST_SOURCE, STRONGEST_LAST_SOURCE, READ_SOURCE)
_NO_MEASUREMENT = (STRONGEST_FIRST, STRONGEST_LAST, READ_SLOTS)
_MAP_FIELDS = ("last", "question", "answer", "null_last", "null_question")


@dataclass(frozen=True)
class Restack:
    """How to restack: `scorer`, the method whose evidence scores the passages (a spec, e.g. "mudaf" or
    "baseline"); `rounds`, scoring passes before answering (interfaces call it `restack_rounds`); `slots`, the prompt
    positions best first (1-based, one per passage), a slot-order JSON file, "first" (strongest first: slot 1, 2,
    ...; needs no measurement, so any model folder restacks), "last" (strongest into the last slot, the one nearest
    the question, then the one before: no measurement either), "read" (per prompt, the slots ordered by how much
    attention each draws in the scorer's content-free pass: also needs no measurement), or None / "measured" for
    the answering model's measured order."""

    scorer: str | MethodConfig = DEFAULT_RESTACK_SCORER
    rounds: int = 1
    slots: tuple[int, ...] | str | Path | None = None
    config: MethodConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_restack_rounds(self.rounds, "rounds")
        if isinstance(self.scorer, MethodConfig):
            config = self.scorer
        else:
            name, options = parse_scorer_spec(self.scorer)
            try:
                config = method_config(name, options)
            except MethodConfigError as err:  # a bad option of a known method: still the restack setting's fault
                raise MethodConfigError(err.problem, about=Remedy("restack", self.scorer)) from None
        object.__setattr__(self, "config", config)
        if isinstance(self.slots, list | tuple):
            slots = tuple(self.slots)
            if sorted(slots) != list(range(1, len(slots) + 1)):
                raise InvalidArgumentError(
                    "expected the prompt positions 1..n (1-based), each once, best first, one per passage, e.g. "
                    "(5, 1, 4, 2, 3).",
                    about=Remedy("slots", self.slots),
                )
            object.__setattr__(self, "slots", slots)
        elif self.slots == "measured":
            object.__setattr__(self, "slots", None)

    @property
    def slot_policy(self) -> str:
        """What a run records and a label shows: "measured", "first", "last", "read", or "given" (slots or a file
        passed)."""
        if self.slots is None:
            return "measured"
        return self.slots if self.slots in _NO_MEASUREMENT else "given"

    @property
    def scorer_spec(self) -> str:
        return self.config.spec()

    @property
    def label(self) -> str:
        """`restack(mudaf)`, `restack(mudaf, rounds=2)`: what a restacked system's label appends."""
        slots = self.slot_policy if self.slot_policy != "given" else "measured"  # a given order is not labelled
        return restacked_label("", self.scorer_spec, self.rounds, slots).removeprefix("+")


def as_restack(restack: str | MethodConfig | Restack | None, rounds: int = 1) -> Restack | None:
    """What an interface takes (a scorer spec or a Restack; None: no restacking) as a Restack, checked."""
    check_restack_rounds(rounds)
    if restack is None:
        if rounds != 1:
            raise InvalidArgumentError(
                f"restack_rounds={rounds!r} has no effect without restacking: pass restack (the scorer method, "
                'e.g. restack="mudaf") too, or leave restack_rounds at 1.'
            )
        return None
    if isinstance(restack, Restack):
        if rounds != 1 and rounds != restack.rounds:
            raise InvalidArgumentError(
                f"restack_rounds={rounds!r} and Restack(rounds={restack.rounds}) disagree: give the rounds once."
            )
        return restack
    return Restack(restack, rounds)


@dataclass(frozen=True)
class SlotOrder:
    """Prompt positions of a K-passage prompt, best first, as measured (or given)."""

    order: tuple[int, ...]
    source: str  # where it came from: a file, or "given"

    @property
    def k(self) -> int:
        return len(self.order)

    def for_count(self, n: int) -> list[int]:
        """The slots of an n-passage prompt, best first: each of its slots reads the measured slot at the same
        relative depth (first to first, last to last), ties to the slot nearer that depth, then the earlier."""
        if n == self.k:
            return list(self.order)
        if self.source == STRONGEST_LAST_SOURCE:  # the last slot first at every count
            return list(range(n, 0, -1))
        if n <= 1 or self.source in _UNMEASURED:  # the identity at every count
            return list(range(1, n + 1))
        rank = {slot: r for r, slot in enumerate(self.order)}

        def key(j: int) -> tuple[int, float, int]:
            depth = 1 + (j - 1) * (self.k - 1) / (n - 1)  # where slot j of n falls among the measured 1..K
            nearest = min(max(int(depth + 0.5), 1), self.k)
            return rank[nearest], abs(depth - nearest), j

        return sorted(range(1, n + 1), key=key)


@lru_cache(maxsize=16)
def read_slot_order(path: str | Path, model_sha256: str | None = None) -> SlotOrder:
    """A slot-order file (eval.slots writes them): {"order": [best first], "model_sha256", ...}; checked against the
    model it claims to measure when `model_sha256` is given."""
    path = Path(path)
    fix = "write one with eval.slots from a position sweep over every slot"
    data = read_json_artefact(path, "slot-order file", fix)  # verified against its recorded sha256 first
    try:
        order = tuple(int(s) for s in data["order"])
    except (KeyError, TypeError, ValueError) as err:
        raise ArtefactError(f"{path}: not a slot-order file ({type(err).__name__}: {err}); {fix}.") from None
    if sorted(order) != list(range(1, len(order) + 1)):
        raise ArtefactError(f"{path}: order {list(order)} is not the positions 1..{len(order)}, each once.")
    recorded = data.get("model_sha256")
    if model_sha256 is not None and recorded is not None and recorded != model_sha256:
        raise ArtefactError(
            f"{path} measures another model (sha256 {str(recorded)[:12]}...) than the one answering "
            f"({model_sha256[:12]}...): measure this model's slots, or pass slots= explicitly."
        )
    return SlotOrder(order, str(path))


@lru_cache(maxsize=1)
def shipped_slot_orders() -> dict[tuple[str, str], Path]:
    """(model, answering method spec) -> the shipped slot-order file measured with that model answering so."""
    found = {}
    for path in json_artefacts(SHIPPED):
        data = read_json_artefact(path, "slot-order file", "reinstall midlens")
        try:
            found[(data["model"], data.get("method", "baseline"))] = path
        except (KeyError, TypeError) as err:
            raise ArtefactError(
                f"{path}: not a slot-order file ({type(err).__name__}: {err}); reinstall midlens."
            ) from None
    return found


def slot_order(generator: Generator, slots: tuple[int, ...] | str | Path | None = None) -> SlotOrder:
    """The slots `generator` reads best: given, read from a file, or the shipped measurement of its model answering
    with its method (else with the base model, `baseline`)."""
    if isinstance(slots, tuple):  # checked by Restack
        return SlotOrder(slots, "given")
    if slots == STRONGEST_FIRST:  # any n reads the identity: every slot's relative depth keeps its rank
        return SlotOrder(tuple(range(1, 11)), STRONGEST_FIRST_SOURCE)
    if slots == STRONGEST_LAST:  # any n reads the reversed identity: the slot nearest the question first
        return SlotOrder(tuple(range(10, 0, -1)), STRONGEST_LAST_SOURCE)
    if slots == READ_SLOTS:  # each prompt's scoring pass orders its slots (`read_slots`)
        return SlotOrder(tuple(range(1, 11)), READ_SOURCE)
    if slots is not None:
        return read_slot_order(str(slots))
    loaded = generator.loaded
    shipped_orders = shipped_slot_orders()
    path = shipped_orders.get((loaded.name, generator.method.spec())) or shipped_orders.get((loaded.name, "baseline"))
    if path is None:
        shipped = ", ".join(sorted({model for model, _ in shipped_orders})) or "none"
        sweep = Step(
            "eval-sweep",
            "measure one with a position sweep over every slot on the train split (midlens.eval: RunOptions(split="
            "'train', k=10, positions=(1, ..., 10)) through plan.build_run and runner.run_units), then write it with "
            "midlens.eval.slots.write_slot_order",
            {"model": loaded.name, "split": "train", "k": 10, "positions": tuple(range(1, 11)), "out": None},
            "and pass its file",
        )
        raise ArtefactError(
            f"no measured slot order for model {loaded.name!r} (measured: {shipped}).",
            remedies=[
                sweep,
                Remedy("slots", "FILE.json"),
                Remedy("slots", (1, 2, 3), "to give the order yourself, best first, one per passage"),
            ],
        )
    return read_slot_order(str(path), loaded.sha256)


# ------------------------------------------------------------------------------------------------- restacking


@dataclass
class Restacked:
    """One prompt restacked: the prompt answered, and `order[j]` the caller's index of the passage in slot j + 1."""

    prompt: StackedPrompt
    order: list[int]
    slots: list[int]
    scores: list[list[float]] = field(default_factory=list)  # per round, the scorer's evidence in the caller's order


def place(scores: list[float], slots: list[int]) -> list[int]:
    """Passage indices in prompt order: the highest score into `slots[0]`, the next into `slots[1]`, ... (ties keep
    the caller's order)."""
    ranked = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    order = [0] * len(scores)
    for i, slot in zip(ranked, slots, strict=True):
        order[slot - 1] = i
    return order


def read_slots(passages: list[PassageEvidence]) -> list[int]:
    """A prompt's slots, best first, read from its own scoring pass: by the attention each slot drew in the
    content-free pass (evidence less calibrated evidence: the question replaced by "N/A"), most first, ties to the
    earlier slot."""
    if any(pe.calibrated is None for pe in passages):
        raise InvalidArgumentError(
            'slots="read" reads the scorer\'s content-free pass, and this one was not calibrated: score with '
            "calibration on (the default), or use another slot policy."
        )
    prior = [pe.evidence - pe.calibrated for pe in passages]  # in prompt order: slot j + 1
    return sorted(range(1, len(prior) + 1), key=lambda j: (-prior[j - 1], j))


def _restacked_prompt(original: StackedPrompt, order: list[int], tokenizer) -> StackedPrompt:
    prompt = render(tokenizer, [original.passages[i] for i in order], original.question, original.style)
    prompt.dropped = list(original.dropped)  # what did not fit stays out: restacking reorders, it does not refill
    return prompt


def _renumber(answer: Answer, where: list[int]) -> None:
    """Move every passage-indexed part of `answer` so the passage now at index i goes to index where[i]."""
    passages = list(answer.passages)
    for i, pe in enumerate(answer.passages):
        pe.position = where[i] + 1
        passages[where[i]] = pe
    answer.passages = passages
    for citation in answer.citations:
        for source in citation.sources:
            source.position = where[source.position - 1] + 1
    if answer.maps is not None:
        source_of = [0] * len(where)  # the new index j takes the old index source_of[j]
        for i, j in enumerate(where):
            source_of[j] = i
        for name in _MAP_FIELDS:
            tensor = getattr(answer.maps, name)
            if tensor is not None:
                # int64 named: torch.tensor([]) of a prompt with no passages is a float, which index_select refuses.
                index = torch.tensor(source_of, dtype=torch.long, device=tensor.device)
                setattr(answer.maps, name, tensor.index_select(-1, index))


def _to_numbering(answer: Answer, numbering: str) -> None:
    record = answer.restack
    if record is None or record["numbering"] == numbering:
        return
    order = [p - 1 for p in record["order"]]  # slot j held the caller's passage order[j]
    if numbering == "original":
        _renumber(answer, order)
    else:
        inverse = [0] * len(order)
        for j, i in enumerate(order):
            inverse[i] = j
        _renumber(answer, inverse)
    record["numbering"] = numbering


@contextmanager
def in_prompt_order(answers: list[Answer]) -> Iterator[list[Answer]]:
    """Restacked answers numbered as their prompt held the passages for the block (what `Generator.verify`, which
    removes passages by prompt position, needs), and in the caller's numbering again after it. Other answers pass."""
    for answer in answers:
        _to_numbering(answer, "prompt")
    try:
        yield answers
    finally:
        for answer in answers:
            _to_numbering(answer, "original")


class Restacker:
    """An answering generator whose prompts are restacked by a scorer's evidence before it answers.

    Offers the answering calls of `Generator` (`prompt`, `generate`, `generate_batch`, `stream`, `device`) with
    their signatures, so whatever drives a generator (`generate_all`, `Pipeline`, the position sweep) drives this.
    The scorer shares the answering generator's loaded model and evidence settings."""

    def __init__(self, generator: Generator, restack: Restack | str):
        self.generator = generator
        self.restack = restack if isinstance(restack, Restack) else Restack(restack)
        self.slot_order = slot_order(generator, self.restack.slots)  # a model without a measured order fails now
        self.scorer = generator.scorer(self.restack.config)

    @property
    def device(self) -> torch.device:
        return self.generator.device

    def prompt(self, *args, **kwargs) -> StackedPrompt:
        """The prompt as the caller stacks it (`Generator.prompt`); restacking happens when it is answered."""
        return self.generator.prompt(*args, **kwargs)

    def arrange(self, prompts: list[StackedPrompt]) -> list[Restacked]:
        """Each prompt restacked: `rounds` scoring passes, each one `score_batch` over the prompts as the previous
        pass placed them (the first over the prompts as given)."""
        state = [Restacked(p, list(range(len(p.passages))), []) for p in prompts]
        movable = [b for b, p in enumerate(prompts) if len(p.passages) > 1]  # one passage has nowhere to go
        for b in movable:
            # Slots given by hand are for one passage count; a measured order scales to any (SlotOrder.for_count).
            if isinstance(self.restack.slots, tuple) and self.slot_order.k != len(prompts[b].passages):
                raise InvalidArgumentError(
                    f"{len(self.restack.slots)} slots for a prompt of {len(prompts[b].passages)} passages: give one "
                    "slot per passage.",
                    about=Remedy("slots", self.restack.slots),
                )
            state[b].slots = self.slot_order.for_count(len(prompts[b].passages))
        for _ in range(self.restack.rounds if movable else 0):
            scored = self.scorer.score_batch([state[b].prompt for b in movable])
            for b, answer in zip(movable, scored, strict=True):
                mine = state[b]
                scores = [0.0] * len(mine.order)
                for j, pe in enumerate(answer.passages):  # in the order this pass's prompt held them
                    scores[mine.order[j]] = pe.score
                mine.scores.append(scores)
                if self.slot_order.source == READ_SOURCE:
                    mine.slots = read_slots(answer.passages)
                mine.order = place(scores, mine.slots)
                mine.prompt = _restacked_prompt(prompts[b], mine.order, self.generator.tokenizer)
        return state

    def _finish(self, answer: Answer, restacked: Restacked, seconds: float) -> Answer:
        answer.restack = {
            "scorer": self.restack.scorer_spec,
            "rounds": self.restack.rounds,
            "slots": restacked.slots,
            "slot_order": self.slot_order.source
            if self.slot_order.source in ("given", *_UNMEASURED)
            else Path(self.slot_order.source).name,
            "order": [i + 1 for i in restacked.order],
            "scores": restacked.scores,
            "numbering": "prompt",
        }
        answer.timings = {"restack_s": seconds, **answer.timings}
        _to_numbering(answer, "original")
        return answer

    def generate_batch(self, prompts: list[StackedPrompt], **options) -> list[Answer]:
        """`Generator.generate_batch` on the restacked prompts: one scoring batch per round, one answering batch;
        each Answer equals its prompt restacked and answered alone."""
        t0 = time.perf_counter()
        state = self.arrange(prompts)
        seconds = time.perf_counter() - t0
        if (listener := options.get("on_citation")) is not None:  # streamed citations in the caller's numbering too
            options["on_citation"] = lambda row, c: listener(row, _in_caller_numbering(c, state[row].order))
        answers = self.generator.generate_batch([s.prompt for s in state], **options)
        return [self._finish(a, s, seconds) for a, s in zip(answers, state, strict=True)]

    def generate(
        self,
        prompt: StackedPrompt,
        on_token: Callable[[str], None] | None = None,
        reference: str | None = None,
        on_citation: Callable[[Citation], None] | None = None,
        **options,
    ) -> Answer:
        """`Generator.generate` on the restacked prompt."""
        callback = None if on_token is None else (lambda _row, piece: on_token(piece))
        cited = None if on_citation is None else (lambda _row, citation: on_citation(citation))
        return self.generate_batch([prompt], on_token=callback, references=[reference], on_citation=cited, **options)[0]

    def stream(self, prompt: StackedPrompt, **kwargs) -> RestackedStream:
        """`Generator.stream` on the restacked prompt: scored now, text deltas as they decode, and `answer` in the
        caller's numbering once the deltas end."""
        t0 = time.perf_counter()
        (restacked,) = self.arrange([prompt])
        seconds = time.perf_counter() - t0
        inner = self.generator.stream(restacked.prompt, **kwargs)
        return RestackedStream(inner, lambda answer: self._finish(answer, restacked, seconds), restacked.order)


def _in_caller_numbering(citation: Citation, order: list[int]) -> Citation:
    """A copy of a citation read from the restacked prompt, numbered as the caller gave the passages (slot j held
    the caller's passage order[j]). A copy: the final Answer is renumbered on its own, by `_finish`."""
    sources = [dataclasses.replace(s, position=order[s.position - 1] + 1) for s in citation.sources]
    return dataclasses.replace(citation, sources=sources)


class RestackedStream(GenerationStream):
    """Iterate for text deltas; `answer` holds the full Answer, in the caller's numbering, once iteration ends.
    `events()` is `GenerationStream.events`, its citations in the caller's numbering."""

    def __init__(self, inner: GenerationStream, finish: Callable[[Answer], Answer], order: list[int]):
        # Not super().__init__: the decoding steps are the inner stream's, read through its events().
        self._inner = inner
        self._finish = finish
        self._order = order
        self.answer: Answer | None = None

    def events(self) -> Iterator[str | Citation]:
        for event in self._inner.events():
            yield event if isinstance(event, str) else _in_caller_numbering(event, self._order)
        if self._inner.answer is not None:
            self.answer = self._finish(self._inner.answer)
