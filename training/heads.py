"""Retrieval heads (MuDAF, Sec. 3): which attention heads look at the passages that answer the question.

For each training prompt (10 HotpotQA paragraphs, the 2 supporting ones gold, order shuffled), the LAST
prompt token's attention is summed per passage for every (layer, head), read with the evidence probe
(SDPA path, no eager attention). A head "attends" the passages whose mass is >= eps; its retrieval score
is the mean over prompts of the F1 between attended and gold passages. The EM variant counts a prompt
when the head's top-|gold| passages are exactly the gold ones.

    scores = retrieval_head_scores(generator, examples)     # {"f1": [L][H], "em": [L][H], ...}
    heads = select_heads(scores["f1"], 8, seed=0)           # generators.methods.retrieval_heads; P(h) ~ exp(R_h / 0.05)
"""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm

from midlens.core.files import make_folder
from midlens.core.saved_parts import save_json_artefact
from midlens.generators.answering.generator import Generator
from midlens.generators.attention.evidence import EvidenceConfig
from midlens.training.data import TrainExample

DEFAULT_EPS = 0.3  # the official code's threshold on a passage's attention mass


def head_f1_em(mass: torch.Tensor, gold: list[int], eps: float = DEFAULT_EPS) -> tuple[torch.Tensor, torch.Tensor]:
    """mass [L, H, P] of one prompt -> per-head F1 of {p: mass >= eps} vs gold, and EM of the top-|gold| set."""
    gold_mask = torch.zeros(mass.shape[-1], dtype=torch.bool)
    gold_mask[gold] = True
    attended = mass >= eps
    hits = (attended & gold_mask).sum(-1).float()
    precision = hits / attended.sum(-1).clamp(min=1)
    recall = hits / len(gold)
    f1 = torch.where(hits > 0, 2 * precision * recall / (precision + recall).clamp(min=1e-9), torch.zeros_like(hits))
    top = mass.topk(len(gold), dim=-1).indices
    em = gold_mask[top].all(-1).float()
    return f1, em


def retrieval_head_scores(
    generator: Generator, examples: list[TrainExample], eps: float = DEFAULT_EPS, progress: bool = True
) -> dict:
    """Mean F1 / EM per (layer, head) over the examples' prompts (baseline or any method of `generator`)."""
    scorer = Generator(generator.loaded, method=generator.method, evidence=EvidenceConfig(query="last", layers="all"))
    f1_sum = em_sum = None
    for ex in tqdm(examples, desc="retrieval-head scores", unit="prompt", disable=not progress):
        answer = scorer.score(ex.prompt, calibrate=False)
        f1, em = head_f1_em(answer.maps.last, ex.gold, eps)
        f1_sum = f1 if f1_sum is None else f1_sum + f1
        em_sum = em if em_sum is None else em_sum + em
    n = len(examples)
    return {
        "model": generator.loaded.name,
        "model_sha256": generator.loaded.sha256,
        "method": generator.method.to_dict(),
        "eps": eps,
        "n": n,
        "f1": (f1_sum / n).tolist(),
        "em": (em_sum / n).tolist(),
    }


def save_scores(scores: dict, path: Path) -> None:
    """Write the scores as a verified JSON artefact (atomic, its sha256 recorded in the folder's manifest), the file
    generators.methods.retrieval_heads.load_scores reads."""
    save_json_artefact(path, scores)


def heatmap(scores: dict, path: Path, key: str = "f1") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.tensor(scores[key])
    fig, ax = plt.subplots(figsize=(max(4, grid.shape[1] * 0.45), max(4, grid.shape[0] * 0.22)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(grid.max()), 1e-6))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"{scores['model']}: retrieval score ({key.upper()}, eps {scores['eps']}, n = {scores['n']})")
    fig.colorbar(im, ax=ax, label=key.upper())
    fig.tight_layout()
    make_folder(path.parent)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
