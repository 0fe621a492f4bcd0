"""MoICE router training: the model frozen, only the routers learn.

loss = NLL(answer tokens) + alpha * mean over layers of N * sum_j F_j P_j   (alpha = 0.3, K < N)

The prompts are the same multi-passage HotpotQA TRAIN-split prompts MuDAF trains on (training.data: 10
paragraphs, gold slots uniform), so routers learn which base to use where the answer's evidence can sit
anywhere in a long prompt. The balance term is averaged over layers (not summed) so alpha keeps the meaning
it has in the paper's per-layer loss whatever the model's depth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from midlens.generators.artefacts import save_artefact
from midlens.generators.context import MethodParts, method_context
from midlens.generators.loading import LoadedModel
from midlens.generators.methods.moice import MoiceScheme, new_schemes, router_state
from midlens.training.data import TrainExample
from midlens.training.loop import LoopConfig, train, training_record


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


def usage_heatmap(per_layer: torch.Tensor, bases: list[float], path) -> None:
    """PNG: layers x experts, the share of (token, head) routes each expert got."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 0.22 * per_layer.shape[0] + 1.5))
    image = ax.imshow(per_layer.numpy(), aspect="auto", cmap="viridis", vmin=0)
    ax.set_xticks(range(len(bases)), [f"{b:g}" for b in bases], rotation=45, ha="right")
    ax.set_xlabel("expert (RoPE base)")
    ax.set_ylabel("layer")
    ax.set_title("MoICE router usage (share of token-head routes)")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    schemes = new_schemes(loaded.model, list(config.bases), config.top_k, config.per_head, seed=loop.seed)
    for s in schemes:
        s.to(loaded.device)
    objective = MoiceObjective(loaded, schemes, config)
    params = {f"layers.{i}.{n}": p for i, s in enumerate(schemes) for n, p in s.router.named_parameters()}
    out_path = Path(out)
    run = {"moice": asdict(config), "data": data, "model": loaded.sha256}
    checkpoint = out_path.with_name(out_path.name + ".checkpoint")
    log = train(params, examples, objective, loop, checkpoint, run, progress, max_seconds)
    meta = {
        "method": "moice",
        "base_model": loaded.name,
        "base_model_sha256": loaded.sha256,
        "options": {},
        "experts": {"bases": list(config.bases), "top_k": config.top_k, "per_head": config.per_head},
        "parameters": sum(p.numel() for p in params.values()),
        "training": {**asdict(config), **training_record(log, loop, loaded.device, loaded.dtype)},
        "data": data,
    }
    save_artefact(out_path, router_state(schemes), meta)
    return {"log": log, "meta": meta}
