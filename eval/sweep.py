"""Position sweep (lost-in-the-middle): one gold among K documents, the gold moved through positions.

A sweep runs systems: generator methods (the registry's), and orderings (`--orderings`) that run on the
baseline generator and only change the passages' order:
  lcr        LlamaIndex's LongContextReorder over the dense retriever's cosine scores (highest-scored
             passages to the two ends of the prompt);
  attn-sort  attention sorting (Peysakhovich & Lerer 2023): score the prompt once, reorder passages
             by calibrated evidence, ascending, so the most-attended passage sits next to the question,
             then answer.
Every answer comes from the library's answer path (rag.answering.Answering: the prompts a generator stacks, answered
with AnswerOptions); the ordering baselines only change passage order. Restacked systems (`--restack SCORER`:
generators.answering.restack) answer with that restack in their options, which scores and places the passages itself;
their rows name the slot the gold was answered from (`gold_prompt_position`) and its rank by the scorer's last pass
(`restack_gold_rank`).
"""

from __future__ import annotations

import time

from midlens.core.batch_size import BatchSize
from midlens.core.errors import InvalidArgumentError, MidlensError, Remedy
from midlens.core.passage import Passage
from midlens.eval.datasets import Example
from midlens.eval.metrics import answer_f1, best_subspan_em
from midlens.generators.answering.answer import Answer
from midlens.generators.answering.generator import Generator
from midlens.generators.answering.restack import Restack
from midlens.generators.models.prompt import DEFAULT_STYLE
from midlens.rag.answering import Answering
from midlens.rag.options import AnswerOptions


def layout(example: Example, k: int, position: int) -> list[Passage]:
    """K documents: the example's first K-1 distractors with its gold inserted at 1-based `position`."""
    if not 1 <= position <= k:
        raise ValueError(f"gold position {position} is outside 1..{k}.")
    distractors = example.distractors
    if len(distractors) < k - 1:
        raise InvalidArgumentError(
            f"example {example.id} has {len(distractors)} distractors, K={k} needs {k - 1}.",
            remedies=[Remedy("k", len(distractors) + 1, "or lower")],
        )
    passages = list(distractors[: k - 1])
    passages.insert(position - 1, example.gold)
    return passages


def dense_scores(question: str, passages: list[Passage]) -> list[float]:
    from midlens.retrievers.dense import embed

    vectors = embed([question] + [f"{p.title}: {p.text}" for p in passages])
    return [float(v @ vectors[0]) for v in vectors[1:]]


def long_context_reorder(question: str, passages: list[Passage]) -> list[Passage]:
    from llama_index.core.postprocessor import LongContextReorder
    from llama_index.core.schema import NodeWithScore, TextNode

    scores = dense_scores(question, passages)
    nodes = [
        NodeWithScore(node=TextNode(text=p.text, id_=str(i)), score=s)
        for i, (p, s) in enumerate(zip(passages, scores, strict=True))
    ]
    return [passages[int(n.node.node_id)] for n in LongContextReorder().postprocess_nodes(nodes)]


def attention_sort(
    gen: Generator, question: str, passages: list[Passage], max_new_tokens: int, style: str = DEFAULT_STYLE
) -> list[Passage]:
    scored = gen.score(gen.prompt(question, passages, max_new_tokens=max_new_tokens, style=style))
    key = [p.score for p in scored.passages]
    order = sorted(range(len(passages)), key=lambda i: key[i])  # ascending: strongest last
    return [passages[i] for i in order]


def _lcr(gen: Generator, question: str, passages: list[Passage], max_new_tokens: int, style: str) -> list[Passage]:
    return long_context_reorder(question, passages)


# The orderings by name (core.defaults.ORDERINGS spells them for `--help`); each runs on the baseline generator.
REORDER = {"lcr": _lcr, "attn-sort": attention_sort}


def arrange(
    gen: Generator,
    example: Example,
    k: int,
    position: int,
    ordering: str | None,
    max_new_tokens: int,
    style: str = DEFAULT_STYLE,
) -> list[Passage]:
    """The passages in prompt order for one sweep cell: the layout, reordered by `ordering` (None: as laid out)."""
    passages = layout(example, k, position)
    if ordering is None:
        return passages
    if ordering not in REORDER:
        raise MidlensError(f"unknown ordering {ordering!r}: choose one of {', '.join(REORDER)}.")
    return REORDER[ordering](gen, example.question, passages, max_new_tokens, style)


def answer_row(
    answering: Answering, options: AnswerOptions, example: Example, passages: list[Passage], logprob: bool
) -> dict:
    """Answer one arranged prompt and score it -> the metric columns of a result row."""
    prompt = answering.prompt(example.question, passages, options)
    reference = example.answers[0] if logprob else None
    (answer,) = answering.answer([prompt], options, references=[reference])
    return row_of(example, answer, logprob)


def row_of(example: Example, answer: Answer, logprob: bool) -> dict:
    """The metric columns of a result row, from one example's answer."""
    gold_id = example.gold_ids[0]
    gold = next(p for p in answer.passages if p.passage.id == gold_id)
    raw_total = sum(p.evidence for p in answer.passages)
    raw_rank = 1 + sum(p.evidence > gold.evidence for p in answer.passages)
    restack = answer.restack
    row = {
        "prediction": answer.text,
        "em": best_subspan_em(answer.text, example.answers),
        "f1": answer_f1(answer.text, example.answers),
        # Where the gold sat in the prompt answered: a restacked answer numbers passages as laid out, its record
        # says which slot held each.
        "gold_prompt_position": gold.position if restack is None else restack["order"].index(gold.position) + 1,
        "gold_rank": gold.rank,
        "gold_rank_raw": raw_rank,
        "gold_share": gold.evidence / raw_total if raw_total > 0 else 0.0,
        "prompt_tokens": answer.prompt_tokens,
    }
    if logprob:
        row["logprob"] = answer.reference_logprob
    if restack is not None and restack["scores"]:
        last = restack["scores"][-1]
        row["restack_gold_rank"] = 1 + sum(s > last[gold.position - 1] for s in last)
        row["slot_order"] = restack["slot_order"]  # which measured order placed it (the reader's own, or its base's)
    return row


class PositionSweep:
    """Evaluates sweep cells; a cell whose arranged prompt equals one already answered reuses that answer.

    Greedy decoding makes the answer a function of the prompt, and an ordering baseline can map every
    gold position to the same prompt (LongContextReorder sorts by retrieval score, so it does, always):
    answering it again would only cost time. A reused row says which position it came from.
    """

    def __init__(
        self,
        gens: dict[str, Generator],
        k: int,
        max_new_tokens: int,
        logprob: bool = True,
        style: str = DEFAULT_STYLE,
        stop_at_line_end: bool = False,
        orderings: dict[str, str] | None = None,
        restacks: dict[str, Restack] | None = None,
    ):
        """`gens`: the generator of each system, by the label its rows carry; `restacks`: label -> the Restack of
        the systems that answer restacked; `orderings`: label -> ordering name for the systems that reorder passages
        (the rest answer the layout as it is). `style`: the prompt's instruction; Liu et al.'s by default, as the
        sweep reproduces their setting. `stop_at_line_end`: decode only the first answer line, the one the metrics
        read."""
        self.gens, self.k, self.max_new_tokens, self.logprob, self.style = gens, k, max_new_tokens, logprob, style
        self.orderings = orderings or {}
        self.stop_at_line_end = stop_at_line_end
        # One answer path per generator; a system is that path and its options (its restack, if any).
        paths: dict[int, Answering] = {}
        self.answering = {label: paths.setdefault(id(gen), Answering(gen)) for label, gen in gens.items()}
        self.options = {
            label: AnswerOptions(
                max_new_tokens=max_new_tokens,
                prompt_style=style,
                stop_at_line_end=stop_at_line_end,
                restack=(restacks or {}).get(label),
            )
            for label in gens
        }
        self._example_id: str | None = None
        self._answered: dict[tuple, tuple[int, dict]] = {}  # (method, passage ids) of the current example

    def __call__(self, example: Example, position: int, method: str) -> dict:
        t0 = time.perf_counter()
        if example.id != self._example_id:  # units come example by example: only the current one can repeat
            self._example_id, self._answered = example.id, {}
        gen = self.gens[method]
        passages = arrange(gen, example, self.k, position, self.orderings.get(method), self.max_new_tokens, self.style)
        key = (method, tuple(p.id for p in passages))
        if key in self._answered:
            first_position, row = self._answered[key]
            row = {**row, "reused_from_position": first_position}
        else:
            row = answer_row(self.answering[method], self.options[method], example, passages, self.logprob)
            self._answered[key] = (position, row)
        return {**row, "seconds": time.perf_counter() - t0}

    def many(self, method: str, cells: list[tuple[Example, int]], batch_size: BatchSize = 1) -> list[dict]:
        """Rows for one method's (example, position) cells, its prompts answered in batches of `batch_size`; rows
        equal `self(...)`'s cell by cell. "seconds" is the cell's share of the wall time (a batch has no per-row
        time). `runner.per_method` hands each method's cells of a group here."""
        t0 = time.perf_counter()
        gen = self.gens[method]
        unique: dict[tuple, int] = {}  # (example, passage ids) -> index of the first cell with that prompt
        first_of: dict[int, int] = {}
        prompts, references, owners = [], [], []
        for i, (example, position) in enumerate(cells):
            passages = arrange(
                gen, example, self.k, position, self.orderings.get(method), self.max_new_tokens, self.style
            )
            key = (example.id, tuple(p.id for p in passages))
            if key in unique:
                first_of[i] = unique[key]
                continue
            unique[key] = i
            prompts.append(self.answering[method].prompt(example.question, passages, self.options[method]))
            references.append(example.answers[0] if self.logprob else None)
            owners.append(i)
        answers = self.answering[method].answer(prompts, self.options[method], batch_size, references)
        rows: list[dict] = [{}] * len(cells)
        for i, answer in zip(owners, answers, strict=True):
            rows[i] = row_of(cells[i][0], answer, self.logprob)
        for i, first in first_of.items():
            rows[i] = {**rows[first], "reused_from_position": cells[first][1]}
        seconds = (time.perf_counter() - t0) / max(1, len(cells))
        return [{**row, "seconds": seconds} for row in rows]
