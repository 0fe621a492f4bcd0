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

import torch
import torch.nn.functional as F

from midlens.generators.context import MethodParts, method_context
from midlens.generators.delta import LoRADelta
from midlens.generators.loading import LoadedModel
from midlens.generators.rope import baseline_schemes
from midlens.training.data import TrainExample
from midlens.training.loop import LoopConfig, TrainingRun, train_artefact


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

    def observe(self, layer, q_rot, keys, weights, past, mask, scale) -> None:
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

    def describe() -> dict:  # the method's own meta fields
        return {
            "options": {"alpha": config.alpha},
            "delta": {
                "kind": "lora",
                "rank": config.rank,
                "lora_alpha": config.lora_alpha,
                "projections": list(config.projections),
                "layers": delta.layers,
                "parameters": delta.num_parameters(),
            },
            "heads": [list(h) for h in config.heads],
            "head_scores": {k: head_scores[k] for k in ("eps", "n", "model_sha256")} if head_scores else None,
        }

    run = TrainingRun(loop, out, data, progress, max_seconds)
    return train_artefact("mudaf", config, loaded, params, examples, objective, run, describe, delta.state_dict)
