"""MuDAF training (Liu et al. 2025): contrastive tuning of retrieval heads, as a LoRA delta on a frozen model.

loss = (1 - alpha) * CLM(answer tokens) + alpha * InfoNCE(q, passage keys)
  - q: the post-RoPE query of the LAST prompt token at each target head, the heads' vectors concatenated;
  - passage keys: per passage, the mean of its tokens' post-RoPE keys at each target head's kv head,
    concatenated the same way; one cosine similarity per passage, temperature tau;
  - each supporting (gold) passage is a positive against the non-supporting ones (up to 10 negatives).
alpha = 0 is plain supervised fine-tuning with the same data, steps and delta: the baseline the
contrastive term must beat (`mudaf(alpha=0)`).

Differences from the official code, on purpose: q and the passage keys are read
inside the long prompt in the same forward as the CLM loss (the official code runs the question and each
passage in separate short forwards), so the heads are trained on the keys they see when answering.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from midlens.core.errors import MidlensError, Remedy, Step
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.attention.rope import baseline_schemes
from midlens.generators.methods.install import MethodParts, method_context
from midlens.generators.models.loading import LoadedModel
from midlens.training.data import TrainExample
from midlens.training.loop import LoopConfig, TrainingRun, train_artefact
from midlens.training.recipe import Budget, Option, Recipe, positive


@dataclass(frozen=True)
class MudafConfig:
    heads: tuple[tuple[int, int], ...]  # target (layer, query head) pairs
    alpha: float = 0.7
    tau: float = 0.05
    rank: int = 16
    lora_alpha: float = 32.0
    projections: tuple[str, ...] = ("q", "k", "v", "o")
    lora_layers: str = "all"  # "all" or "targets" (only the layers holding target heads)
    max_negatives: int = 10


class QueryKeyTap:
    """Reads, inside the attention forward and with gradients, the target heads' post-RoPE query at one row
    and their mean post-RoPE key over each passage span. Plugs in where the evidence probe does."""

    def __init__(self, heads: list[tuple[int, int]], spans: list[tuple[int, int]], row: int, group: int):
        self.by_layer: dict[int, list[int]] = {}
        for layer, head in heads:
            self.by_layer.setdefault(layer, []).append(head)
        self.row, self.group = row, group
        end = max(e for _, e in spans)
        weights = torch.zeros(len(spans), end)
        for p, (s, e) in enumerate(spans):
            weights[p, s:e] = 1.0 / (e - s)
        self.span_means = weights  # [P, T'] averaging matrix
        self.queries: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []

    def observe(self, layer, q_rot, keys, weights, past, mask, scoring) -> None:
        heads = self.by_layer.get(layer)
        if not heads:
            return
        idx = torch.tensor(heads, device=q_rot.device)
        self.queries.append(q_rot[0, 0].index_select(0, idx)[:, self.row])  # [n, d]
        kv = keys[0, 0].index_select(0, idx // self.group if keys.shape[2] != q_rot.shape[2] else idx)  # [n, T, d]
        means = self.span_means.to(kv.device, kv.dtype)
        self.keys.append(torch.einsum("pt,ntd->pnd", means, kv[:, : means.shape[1]]))  # [P, n, d]

    def vectors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q [n*d] and passage keys [P, n*d], heads in (layer, head) order."""
        q = torch.cat(self.queries, dim=0).flatten()
        k = torch.cat(self.keys, dim=1).flatten(1)
        return q, k


def contrastive_loss(q: torch.Tensor, keys: torch.Tensor, gold: list[int], tau: float, max_negatives: int = 10):
    """InfoNCE, one positive at a time: -log softmax(cos(q, k_p) / tau) at each gold p, among the negatives."""
    sims = F.cosine_similarity(q.float()[None], keys.float(), dim=-1) / tau  # [P]
    negatives = [p for p in range(len(sims)) if p not in gold][:max_negatives]
    losses = [-(torch.log_softmax(sims[[g] + negatives], dim=0)[0]) for g in gold]
    return torch.stack(losses).mean()


def new_delta(loaded: LoadedModel, config: MudafConfig) -> LoRADelta:
    layers = range(loaded.model.config.num_hidden_layers)
    if config.lora_layers == "targets":
        layers = sorted({layer for layer, _ in config.heads})
    return LoRADelta(loaded.model, layers, config.projections, config.rank, config.lora_alpha)


class MudafObjective:
    def __init__(self, loaded: LoadedModel, parts: MethodParts, config: MudafConfig):
        self.loaded, self.parts, self.config = loaded, parts, config
        cfg = loaded.model.config
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads

    def __call__(self, ex: TrainExample) -> tuple[torch.Tensor, dict[str, float]]:
        prompt_len, answer = ex.prompt.num_tokens, ex.answer_ids
        ids = torch.tensor([ex.input_ids], device=self.loaded.device)
        tap = QueryKeyTap(list(self.config.heads), ex.prompt.passage_spans, prompt_len - 1, self.group)
        with method_context(self.loaded, self.parts, probe=tap if self.config.alpha > 0 else None):
            logits = self.loaded.model(input_ids=ids, use_cache=False, logits_to_keep=len(answer) + 1).logits[0]
        clm = F.cross_entropy(logits[:-1].float(), torch.tensor(answer, device=logits.device))
        if self.config.alpha == 0:
            return clm, {"clm": clm.item()}
        q, keys = tap.vectors()
        con = contrastive_loss(q, keys, ex.gold, self.config.tau, self.config.max_negatives)
        loss = (1 - self.config.alpha) * clm + self.config.alpha * con
        return loss, {"clm": clm.item(), "con": con.item()}


def train_mudaf(
    loaded: LoadedModel,
    examples: list[TrainExample],
    config: MudafConfig,
    loop: LoopConfig,
    out: str,
    data: dict,
    head_scores: dict | None = None,
    progress: bool = True,
    max_seconds: float | None = None,
) -> dict:
    """Train a delta and save it as a `mudaf` artefact folder at `out` (checkpoints in `out`.checkpoint)."""
    loaded.model.requires_grad_(False)
    delta = new_delta(loaded, config)
    parts = MethodParts(baseline_schemes(loaded.model), delta)
    objective = MudafObjective(loaded, parts, config)
    params = dict(delta.named_parameters())

    def describe() -> dict:  # MuDAF's own record; the delta writes its "delta" section itself
        return {
            "options": {"alpha": config.alpha},
            "heads": [list(h) for h in config.heads],
            "head_scores": {k: head_scores[k] for k in ("eps", "n", "model_sha256")} if head_scores else None,
        }

    run = TrainingRun(loop, out, data, progress, max_seconds)
    return train_artefact("mudaf", config, loaded, params, examples, objective, run, describe, delta.save)


def _check(options: dict) -> None:
    positive(options, "rank", "num_heads", "heads_n", "tau")
    if not 0 <= options["alpha"] <= 1:
        raise MidlensError(f"alpha {options['alpha']}: the contrastive weight is in [0, 1].")
    heads_file = options["heads_file"]
    if heads_file and not Path(heads_file).is_file():
        score = Step(
            "heads-score",
            "score the model's retrieval heads (midlens.training.heads.retrieval_head_scores, then save_scores)",
            {"model": None, "out": None},
        )
        raise MidlensError("no such file.", [score], about=Remedy("heads_file", heads_file))


def _train(loaded: LoadedModel, options: dict, budget: Budget, out: str) -> dict:
    """Retrieval-head scores (read from `heads_file`, or computed on other train-split prompts), the target heads
    drawn from them, then the delta trained on `budget.examples` train-split prompts."""
    from midlens.generators import Generator
    from midlens.generators.methods.retrieval_heads import load_scores, select_heads
    from midlens.training.data import training_examples
    from midlens.training.heads import retrieval_head_scores, save_scores

    if options["heads_file"]:
        scores = load_scores(loaded, options["heads_file"])  # verified (its recorded sha256), and for this model
    else:
        probe = training_examples(
            loaded.tokenizer, options["heads_n"], seed=budget.seed + 1, max_words=budget.max_words
        )
        # The stock model's heads: Generator(loaded) alone would run the model's answering default, which for a
        # packaged model may be a trained delta (core.defaults.ANSWER_METHODS).
        scores = retrieval_head_scores(Generator(loaded, method="baseline"), probe, progress=budget.progress)
        save_scores(scores, Path(out).with_name(Path(out).name + ".heads.json"))
        budget.note_spent(f"retrieval-head scoring ({len(probe)} prompts)")
    heads = select_heads(
        scores["f1"], options["num_heads"], seed=budget.seed, mode=options["head_selection"], tiebreak=scores.get("em")
    )
    examples, loop, data = budget.plan(loaded.tokenizer)
    config = MudafConfig(
        tuple(heads), options["alpha"], options["tau"], options["rank"], 2.0 * options["rank"],
        lora_layers=options["lora_layers"],
    )  # fmt: skip
    return train_mudaf(loaded, examples, config, loop, out, data, scores, budget.progress, budget.max_seconds)


RECIPE = Recipe(
    summary="contrastive tuning of retrieval heads as a LoRA delta (alpha=0: plain fine-tuning)",
    options=(
        Option("alpha", 0.7, "weight of the contrastive loss (0 = plain SFT)"),
        Option("tau", 0.05, "InfoNCE temperature"),
        Option("rank", 16, "LoRA rank (its alpha is twice the rank)"),
        Option("lora_layers", "all", "layers the delta adapts", choices=("all", "targets")),
        Option("num_heads", 8, "target heads"),
        Option("head_selection", "sample", "how target heads are drawn from the scores", choices=("sample", "top")),
        Option(
            "heads_file",
            None,
            "retrieval-head scores (a file training.heads.save_scores writes; default: computed first)",
            type=str,
        ),
        Option("heads_n", 200, "prompts for the head scores when computed here"),
    ),
    budget={"examples": 4000, "lr": 2e-4, "warmup": 0.05, "max_words": 80},
    train=_train,
    check=_check,
    trained="delta",
)
