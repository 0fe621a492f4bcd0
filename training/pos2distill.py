"""Pos2Distill (Wang et al., EMNLP 2025), its retrieval system R1: position-to-position self-distillation, trained
as a LoRA delta on a frozen model.

The frozen model reading the supporting paragraphs where it reads best (the advantageous placement) is the
teacher: its greedy answer R there, and its next-token distributions along R, are the targets. The student (the
same model plus the delta) reads the same paragraphs placed elsewhere, K placements per question, and is pulled
towards the teacher's distributions along the same R; an anchoring term keeps the advantageous placement where it
was:

    L = sum_k w_k KL(teacher(R | P_adv) || student(R | P_k)) + lambda KL(teacher(R | P_adv) || student(R | P_adv))

Choices, and where they differ from the paper:
- The advantageous placement is measured per model, not assumed: the slots a position sweep over every slot on the
  train split ranks best (`generators/trained/slot-orders`, what restacking reads), the supporting paragraphs in the
  best ones. The paper's is slot 1, the attention sink (`advantage="first"`); its reasoning system R2 uses the last
  two slots, which is what the sweep measured for SmolLM2.
- w_k are the paper's position-aware weights (a softmax over the loss at each trivial position, times each
  instance's loss over the largest at its position), computed over one question's K placements: a training step
  here reads one question at a time, so the intra-position factor is 1 and w = softmax(detached losses).
  `weighting="uniform"` takes the plain mean.
- KL on the teacher's own answer, not cross-entropy on the gold one: the paper's ablation (its Table 3) finds the
  soft targets better than hard labels; supervised fine-tuning on the same split is `mudaf(alpha=0)`.
- R is the teacher's answer whether right or wrong, as the paper distils what the model says at its best position;
  the meta records how often it was right.
- A LoRA delta (rank 16 on q, k, v, o of every layer, like MuDAF's) instead of the paper's full fine-tuning at lr
  3e-6, so the base weights stay shared and the artefact is small.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from midlens.core.defaults import PROMPT_STYLES
from midlens.core.errors import MidlensError
from midlens.generators.answering.generator import Generator
from midlens.generators.answering.restack import SlotOrder, slot_order
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.attention.positional_attention import new_cache
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.models.loading import LoadedModel
from midlens.generators.models.prompt import StackedPrompt, render
from midlens.training.data import TrainExample
from midlens.training.loop import LoopConfig, TrainingRun, train_artefact
from midlens.training.recipe import Budget, Option, Recipe, positive

ADVANTAGES = ("measured", "first")
WEIGHTINGS = ("position-aware", "uniform")


@dataclass(frozen=True)
class Pos2DistillConfig:
    placements: int = 4  # K: trivial placements of each question's paragraphs per step
    anchor: float = 1.0  # lambda, the anchoring term's weight
    advantage: str = "measured"  # where the teacher reads the supporting paragraphs: ADVANTAGES
    weighting: str = "position-aware"  # WEIGHTINGS
    style: str = "short"  # the instruction the prompts carry (generators.models.prompt.STYLES)
    max_answer_tokens: int = 16  # the teacher's greedy answer stops here, at end of sequence or at a line end
    rank: int = 16
    lora_alpha: float = 32.0
    seed: int = 0


def advantageous_slots(order: SlotOrder | None, count: int, gold: int) -> list[int]:
    """The 1-based slots, best first, that the `gold` supporting paragraphs of a `count`-passage prompt take:
    the measured order's best ones, or slots 1..gold (the paper's sink) without one."""
    if order is None:
        return list(range(1, gold + 1))
    return order.for_count(count)[:gold]


def place(passages: list, gold: list[int], slots: list[int]) -> list:
    """`passages` with the gold ones (indices, in the order given) in `slots` (1-based) and the others, in their
    order, in the remaining slots."""
    placed: list = [None] * len(passages)
    for g, slot in zip(gold, slots, strict=True):
        placed[slot - 1] = passages[g]
    others = iter(p for i, p in enumerate(passages) if i not in set(gold))
    return [p if p is not None else next(others) for p in placed]


def trivial_placements(passages: list, gold: list[int], advantage: list[int], k: int, rng: random.Random) -> list:
    """K seeded orders of `passages` whose gold paragraphs do not all sit in the advantageous slots."""
    orders, tries = [], 0
    while len(orders) < k:
        order = list(range(len(passages)))
        rng.shuffle(order)
        slots = {order.index(g) + 1 for g in gold}
        tries += 1
        if slots != set(advantage) or tries > 100 * k:  # a 2-of-10 draw hits them 1 time in 45
            orders.append([passages[i] for i in order])
    return orders


def kl_to_teacher(teacher_logprobs: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) per position, averaged over the answer's positions (teacher log-probs given)."""
    student = F.log_softmax(student_logits.float(), dim=-1)
    return (teacher_logprobs.exp() * (teacher_logprobs - student)).sum(-1).mean()


class Pos2DistillObjective:
    """One question: the teacher's answer at the advantageous placement, then the student's KL at K trivial
    placements (position-aware weights) plus the anchoring KL at the advantageous one."""

    def __init__(self, loaded: LoadedModel, parts: MethodParts, config: Pos2DistillConfig, order: SlotOrder | None):
        self.loaded, self.parts, self.config, self.order = loaded, parts, config, order
        self.teacher = Generator(loaded, method="baseline", citations=None)
        self.teacher_right = 0
        self.teacher_seen = 0

    def prompt(self, passages: list, question: str) -> StackedPrompt:
        return render(self.loaded.tokenizer, passages, question, style=self.config.style)

    def teacher_answer(self, prompt: StackedPrompt) -> tuple[list[int], torch.Tensor]:
        """The frozen model's greedy answer and its log-probabilities at each answer position plus the one after
        (where it stopped): [len(answer) + 1, vocab]. One prefill and one step per token, on the prompt's cache."""

        teacher, tokens, rows = self.teacher, [], []
        with teacher.running():
            cache = new_cache()
            logits = teacher.forward(prompt.input_ids, cache)[-1]
            while True:
                rows.append(F.log_softmax(logits.float(), dim=-1))
                token = int(logits.argmax())
                text = teacher.tokenizer.decode(tokens + [token])
                if token in teacher.eos_ids or len(tokens) >= self.config.max_answer_tokens:
                    break
                if "\n" in text and text.strip():  # the short answer's line has ended
                    break
                tokens.append(token)
                logits = teacher.forward([token], cache)[-1]
        return tokens, torch.stack(rows)

    def student_logits(self, prompt: StackedPrompt, answer: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt.input_ids + answer], device=self.loaded.device)
        with method_context(self.loaded, self.parts):
            return self.loaded.model(input_ids=ids, use_cache=False, logits_to_keep=len(answer) + 1).logits[0]

    def __call__(self, ex: TrainExample) -> tuple[torch.Tensor, dict[str, float]]:
        cfg = self.config
        passages, question = ex.prompt.passages, ex.prompt.question
        adv_slots = advantageous_slots(self.order, len(passages), len(ex.gold))
        adv_prompt = self.prompt(place(passages, ex.gold, adv_slots), question)
        answer, target = self.teacher_answer(adv_prompt)
        gold_text = self.loaded.tokenizer.decode(ex.answer_ids, skip_special_tokens=True).strip().lower()
        said = self.loaded.tokenizer.decode(answer, skip_special_tokens=True).strip().lower()
        self.teacher_seen += 1
        self.teacher_right += int(bool(gold_text) and gold_text in said)
        rng = random.Random(f"{cfg.seed}:{ex.id}")  # the same placements when a cut run resumes
        losses = [
            kl_to_teacher(target, self.student_logits(self.prompt(order, question), answer))
            for order in trivial_placements(passages, ex.gold, adv_slots, cfg.placements, rng)
        ]
        stacked = torch.stack(losses)
        if cfg.weighting == "position-aware":
            weights = torch.softmax(stacked.detach(), dim=0)
        else:
            weights = torch.full_like(stacked, 1.0 / len(losses))
        activation = (weights * stacked).sum()
        anchoring = kl_to_teacher(target, self.student_logits(adv_prompt, answer))
        loss = activation + cfg.anchor * anchoring
        return loss, {"act": activation.item(), "anc": anchoring.item()}


def new_delta(loaded: LoadedModel, config: Pos2DistillConfig) -> LoRADelta:
    layers = range(loaded.model.config.num_hidden_layers)
    return LoRADelta(loaded.model, layers, ("q", "k", "v", "o"), config.rank, config.lora_alpha)


def measured_order(loaded: LoadedModel, advantage: str) -> SlotOrder | None:
    """The model's measured slot order for `advantage="measured"` (refused, with what to do, where none ships)."""
    if advantage == "first":
        return None
    return slot_order(Generator(loaded, method="baseline", citations=None))


def train_pos2distill(
    loaded: LoadedModel,
    examples: list[TrainExample],
    config: Pos2DistillConfig,
    loop: LoopConfig,
    out: str,
    data: dict,
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict:
    """Train a delta and save it as a `pos2distill` artefact folder at `out` (checkpoints in `out`.checkpoint)."""
    loaded.model.requires_grad_(False)
    delta = new_delta(loaded, config)
    order = measured_order(loaded, config.advantage)
    objective = Pos2DistillObjective(loaded, MethodParts(baseline_schemes(loaded.model), delta), config, order)
    params = dict(delta.named_parameters())

    def describe() -> dict:  # read after training: the teacher's accuracy over the questions it answered
        return {
            "options": {},
            "advantage": {
                "kind": config.advantage,
                "slots_of_10": advantageous_slots(order, 10, 2),
                "slot_order": None if order is None else order.source.rsplit("/", 1)[-1],
            },
            "teacher": {
                "answers": objective.teacher_seen,
                "gold_in_answer": objective.teacher_right / max(1, objective.teacher_seen),
            },
        }

    run = TrainingRun(loop, out, data, progress, max_seconds)
    return train_artefact("pos2distill", config, loaded, params, examples, objective, run, describe, delta.save)


def _check(options: dict) -> None:
    positive(options, "placements", "rank", "max_answer_tokens")
    if options["anchor"] < 0:
        raise MidlensError(f"anchor {options['anchor']}: the anchoring weight lambda is >= 0.")


def _train(loaded: LoadedModel, options: dict, budget: Budget, out: str) -> dict:
    config = Pos2DistillConfig(
        options["placements"], options["anchor"], options["advantage"], options["weighting"], options["style"],
        options["max_answer_tokens"], options["rank"], 2.0 * options["rank"], budget.seed,
    )  # fmt: skip
    examples, loop, data = budget.plan(loaded.tokenizer, style=config.style)
    return train_pos2distill(loaded, examples, config, loop, out, data, budget.progress, budget.max_seconds)


RECIPE = Recipe(
    summary="position-to-position self-distillation (the model at its best slots teaches the others), a LoRA delta",
    options=(
        Option("placements", 4, "K: trivial placements of each question's paragraphs per step"),
        Option("anchor", 1.0, "lambda: weight of the anchoring KL at the advantageous placement"),
        Option("advantage", "measured", "where the teacher reads the gold paragraphs", choices=ADVANTAGES),
        Option("weighting", "position-aware", "how the K placements' losses are weighted", choices=WEIGHTINGS),
        Option("style", "short", "the prompts' instruction", choices=PROMPT_STYLES),
        Option("max_answer_tokens", 16, "longest teacher answer distilled"),
        Option("rank", 16, "LoRA rank (its alpha is twice the rank)"),
    ),
    budget={"examples": 300, "lr": 2e-4, "warmup": 0.05, "max_words": 60},
    train=_train,
    check=_check,
    trained="delta",
)
