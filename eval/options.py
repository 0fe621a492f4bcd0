"""What an evaluation run is asked to do, as one frozen value: the command line builds it, planning reads it, the
Ray engine ships it to its workers (a dataclass pickles).

Every field is converted and checked here, once, when the value is made (the cheap checks first, so a wrong
option is refused before torch loads); the layers below trust the types. Errors name a field by its Python
keyword; the command line renders the same error with its flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from midlens.core.batch_size import BatchSize
from midlens.core.defaults import DEFAULT_PROMPT_STYLE, DEFAULT_RETRIEVAL, DEFAULT_TOP_K, EVAL_MODEL, ORDERINGS
from midlens.core.errors import MidlensError, Remedy
from midlens.core.method_spec import restacked_label

if TYPE_CHECKING:  # torch loads with the registry, after the cheap checks
    from midlens.generators.attention.evidence import EvidenceConfig
    from midlens.generators.methods.registry import MethodConfig

Mode = Literal["sweep", "rerank", "e2e"]


@dataclass(frozen=True)
class RunOptions:
    """One eval run: what it evaluates (mode, data, systems, model), and how it runs (engine, shard, batch size).

    `methods` are method specs as given (they label the rows); `orderings` run on the baseline generator under
    their own names. `restack` (a scorer method spec) adds, beside each method, the method answering passages
    restacked by that scorer's evidence, once per entry of `restack_rounds`, labelled `METHOD+restack(SCORER)`
    (`restacked` maps those labels to what they run). `configs` (made here) holds the validated MethodConfig of
    every row label. `device` and `dtype` stay as asked ("auto"): they are resolved where the model loads, which
    on Ray is a worker."""

    mode: Mode
    out: Path
    methods: tuple[str, ...] = ("baseline",)
    orderings: tuple[str, ...] = ()
    restack: str | None = None
    restack_rounds: tuple[int, ...] = (1,)
    restack_slots: str = "measured"  # core.defaults.SLOT_POLICIES
    restack_methods: tuple[str, ...] = ()  # the methods that also answer restacked (empty: every one of `methods`)
    model: str = EVAL_MODEL
    device: str = "auto"
    dtype: str = "auto"
    evidence: EvidenceConfig | None = None
    n: int | None = None
    seed: int = 0
    max_new_tokens: int = 24
    prompt_style: str = DEFAULT_PROMPT_STYLE
    # sweep and rerank: the data
    dataset: str = "hotpotqa"
    # None: the dataset's own default, HotpotQA's eval split and all of SQuAD (what SQuAD runs read before it had
    # a split); squad's "eval"/"train" are its articles (retrievers.squad).
    split: Literal["eval", "train"] | None = None
    max_words: int = 100  # 0: whole paragraphs
    # sweep
    k: int = 10
    positions: tuple[int, ...] = ()  # empty: 1, K/2 and K
    logprob: bool = True
    stop_at_line_end: bool = False
    # e2e
    questions: Path | None = None
    corpus: Path | None = None
    index_dir: Path | None = None
    top_k: int = DEFAULT_TOP_K
    retrieval: str = DEFAULT_RETRIEVAL
    # how it runs
    batch_size: BatchSize = 1
    shard: tuple[int, int] = (0, 1)
    limit: int | None = None
    progress: bool = True
    engine: Literal["local", "ray"] = "local"
    address: str | None = None
    workers: int = 2
    gpus_per_worker: float = 0.0
    threads_per_worker: int = 1
    # Each method spec parsed once, here: spec -> (name, options); `configs` validates the options.
    parsed: dict[str, tuple[str, dict]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.split is not None and self.dataset not in ("hotpotqa", "squad"):
            raise MidlensError("only the hotpotqa and squad datasets have splits.", about=Remedy("split", self.split))
        if self.mode == "sweep":
            bad = [p for p in self.positions if not 1 <= p <= self.k]
            if bad:
                raise MidlensError(f"{bad} outside 1..{self.k} (K).", about=Remedy("positions", self.positions))
        if self.gpus_per_worker < 0:
            gpus = Remedy("gpus_per_worker", self.gpus_per_worker)
            raise MidlensError("expected a number >= 0, e.g. 1 or 0.5.", about=gpus)
        object.__setattr__(self, "parsed", _parse_systems(self.methods, self.orderings))
        _check_restack(self)

    @cached_property
    def configs(self) -> dict[str, MethodConfig]:
        """The validated MethodConfig of every row label (an ordering runs on the baseline generator). Made at first
        use, which imports the registry (torch): the options' other checks come first."""
        from midlens.generators.methods.registry import method_config

        configs = {spec: method_config(name, options) for spec, (name, options) in self.parsed.items()}
        if self.restack is not None:
            from midlens.generators.answering.restack import Restack

            Restack(self.restack, slots=self.restack_slots)  # the scorer's options, before any model loads
        configs.update({label: configs[method] for label, (method, _, _) in self.restacked.items()})
        configs.update({name: method_config("baseline") for name in self.orderings})
        return configs

    @property
    def restacked(self) -> dict[str, tuple[str, str, int]]:
        """Each restacked system's label -> (the method label it answers with, the scorer spec, rounds)."""
        if self.restack is None:
            return {}
        return {
            restacked_label(method, self.restack, rounds, self.restack_slots): (method, self.restack, rounds)
            for method in self.restack_methods or self.methods
            for rounds in self.restack_rounds
        }

    @property
    def gold_positions(self) -> list[int]:
        """The positions a sweep moves the gold through."""
        return list(self.positions) or sorted({1, max(1, self.k // 2), self.k})


def _check_restack(options: RunOptions) -> None:
    """--restack's scorer and rounds, before anything heavy loads."""
    from midlens.core.defaults import SLOT_POLICIES
    from midlens.core.method_spec import parse_scorer_spec
    from midlens.core.validation import check_restack_rounds

    if options.restack_slots not in SLOT_POLICIES:
        raise MidlensError(
            f"unknown slot policy; expected one of {', '.join(SLOT_POLICIES)}.",
            about=Remedy("restack_slots", options.restack_slots),
        )
    stray = [m for m in options.restack_methods if m not in options.methods]
    if stray:
        raise MidlensError(
            f"{', '.join(stray)} not among the methods run ({', '.join(options.methods)}): a restacked system is "
            "compared with its method alone, so name it in the methods too.",
            about=Remedy("restack_methods", ",".join(options.restack_methods)),
        )
    if options.restack is None:
        if tuple(options.restack_rounds) != (1,) or options.restack_methods:
            rounds = Remedy("restack_rounds", options.restack_rounds)
            raise MidlensError(
                "these count the scoring passes of restacked systems, and none is asked for.",
                about=rounds,
                remedies=[Remedy("restack", "mudaf", "(or another scorer method) to run them")],
            )
        return
    parse_scorer_spec(options.restack)
    if not options.restack_rounds or len(set(options.restack_rounds)) != len(options.restack_rounds):
        raise MidlensError(
            "give the scoring passes to run, each once, e.g. 1 or 1,2.", about=Remedy("restack_rounds", "")
        )
    for rounds in options.restack_rounds:
        check_restack_rounds(rounds)
    if options.mode == "rerank":
        raise MidlensError(
            "rerank scores passages and answers nothing, so there is no answer to restack: use it with sweep or e2e.",
            about=Remedy("restack", options.restack),
        )
    if not options.methods:
        raise MidlensError("restacking runs beside methods: name them.", remedies=[Remedy("methods", "baseline")])


def _parse_systems(methods: tuple[str, ...], orderings: tuple[str, ...]) -> dict[str, tuple[str, dict]]:
    """Method specs -> (name, options) each, and the ordering names checked; a misspelt name is refused before the
    registry (torch) is imported."""
    from midlens.core.method_spec import parse_known_specs

    if not methods and not orderings:
        raise MidlensError("no method to run.", remedies=[Remedy("methods", "baseline", "to run one")])
    misplaced = [spec for spec in methods if spec.strip() in ORDERINGS]
    if misplaced:
        raise MidlensError(
            f"{', '.join(misplaced)}: an ordering, not a method.", remedies=[Remedy("orderings", ",".join(misplaced))]
        )
    unknown = [name for name in orderings if name not in ORDERINGS]
    if unknown:
        raise MidlensError(f"choose from {', '.join(ORDERINGS)}.", about=Remedy("orderings", ",".join(unknown)))
    return parse_known_specs(list(methods))
