"""MoICE router training: the model frozen, only the routers learn.

loss = NLL(answer tokens) + alpha * mean over layers of N * sum_j F_j P_j   (alpha = 0.3, K < N)

The prompts are the same multi-passage HotpotQA TRAIN-split prompts MuDAF trains on (training.data: 10
paragraphs, gold slots uniform), so routers learn which base to use where the answer's evidence can sit
anywhere in a long prompt. The balance term is averaged over layers (not summed) so alpha keeps the meaning
it has in the paper's per-layer loss whatever the model's depth.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from midlens.core.errors import MidlensError
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.methods.moice import MoiceRouters, MoiceScheme, routed_schemes
from midlens.generators.models.loading import LoadedModel
from midlens.training.data import TrainExample
from midlens.training.loop import LoopConfig, TrainingRun, train_artefact
from midlens.training.recipe import Budget, Option, Recipe, positive


@dataclass(frozen=True)
class MoiceConfig:
    bases: tuple[float, ...]
    top_k: int = 3
    per_head: bool = False
    balance: float = 0.3  # alpha of the load-balancing loss


class MoiceObjective:
    def __init__(self, loaded: LoadedModel, schemes: list[MoiceScheme], config: MoiceConfig):
        loaded.model.requires_grad_(False)  # router-only: the model's weights never get gradients
        self.loaded, self.parts, self.config = loaded, MethodParts(list(schemes)), config

    def __call__(self, ex: TrainExample) -> tuple[torch.Tensor, dict[str, float]]:
        ids = torch.tensor([ex.input_ids], device=self.loaded.device)
        answer = ex.answer_ids
        with method_context(self.loaded, self.parts) as run:
            logits = self.loaded.model(input_ids=ids, use_cache=False, logits_to_keep=len(answer) + 1).logits[0]
            balance = run.aux_loss() / len(self.parts.schemes)
        nll = F.cross_entropy(logits[:-1].float(), torch.tensor(answer, device=logits.device))
        loss = nll + self.config.balance * balance
        return loss, {"nll": nll.item(), "balance": balance.item()}


def train_moice(
    loaded: LoadedModel,
    examples: list[TrainExample],
    config: MoiceConfig,
    loop: LoopConfig,
    out: str,
    data: dict,
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict:
    """Train routers and save them as a `moice` artefact at `out` (checkpoints in `out`.checkpoint)."""
    routers = MoiceRouters.new(loaded.model, list(config.bases), config.top_k, config.per_head, seed=loop.seed)
    schemes = routers.schemes
    for s in schemes:
        s.to(loaded.device)
    objective = MoiceObjective(loaded, schemes, config)
    routed = routed_schemes(schemes).items()  # NoPE layers have no router
    params = {f"layers.{i}.{n}": p for i, s in routed for n, p in s.router.named_parameters()}

    def describe() -> dict:  # MoICE's own record; the routers write their "experts" section themselves
        return {"options": {}}

    run = TrainingRun(loop, out, data, progress, max_seconds)
    return train_artefact("moice", config, loaded, params, examples, objective, run, describe, routers.save)


def _check(options: dict) -> None:
    positive(options, "experts", "top_k")
    if not options["top_k"] < options["experts"]:
        raise MidlensError(
            f"top-k {options['top_k']} with experts {options['experts']}: K must be below N, or the balance loss is "
            "a constant with no gradient."
        )
    if options["balance"] < 0:
        raise MidlensError(f"balance {options['balance']}: a weight, 0 or more.")


def _train(loaded: LoadedModel, options: dict, budget: Budget, out: str) -> dict:
    """Expert bases derived for the model's RoPE (the native one first), then the routers trained on
    `budget.examples` train-split prompts with the model frozen."""
    from midlens.generators.methods.rope_bases import complementary_bases, rope_base, rotary_dim_of

    cfg = loaded.model.config
    bases = complementary_bases(rope_base(cfg), rotary_dim_of(loaded.model), options["experts"])
    print("expert bases: " + ", ".join(f"{b:g}" for b in bases), file=sys.stderr)
    examples, loop, data = budget.plan(loaded.tokenizer)
    config = MoiceConfig(tuple(bases), options["top_k"], options["per_head"], options["balance"])
    return train_moice(loaded, examples, config, loop, out, data, budget.progress, budget.max_seconds)


RECIPE = Recipe(
    summary="router-only training of MoICE (the model stays frozen)",
    options=(
        Option("experts", 7, "N: RoPE bases (the native one first)"),
        Option("top_k", 3, "K < N experts per token and head"),
        Option("per_head", False, "one router per head instead of per layer"),
        Option("balance", 0.3, "alpha of the load-balancing loss"),
    ),
    # Routers are tiny and see few steps on a CPU budget; warm-up 20 % as in the paper.
    budget={"examples": 600, "lr": 2e-3, "warmup": 0.2, "max_words": 60},
    train=_train,
    check=_check,
    trained="router",
)
