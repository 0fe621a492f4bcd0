"""`midlens methods moice`: what the routers of a loaded MoICE generator do: their bases' waveforms and the share
of (token, head) routes each expert gets, per layer, as text, JSON and PNG."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from midlens.generators.methods.rope_bases import head_dim_of, plot_waveforms, rope_base


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


def inspect_routers(gen, schemes: list, prompts: list, out: Path | None = None) -> list[str]:
    """`midlens methods moice ...`: the expert bases the routers mix, and the share of (token, head) routes each
    expert gets on `prompts` (StackedPrompts), per layer. With `out`: moice-bases.png (the bases' waveforms),
    moice-usage.json and moice-usage.png (layers x experts). `schemes`: the layers' MoICE schemes (NoPE layers have
    no router), given by the method module so this one does not import it back."""
    config = gen.loaded.model.config
    head_dim = head_dim_of(config)
    bases = list(schemes[0].bases)
    lines = [
        f"{gen.loaded.name}: head_dim {head_dim}, native RoPE base {rope_base(config):g}",
        "expert bases: " + ", ".join(f"{b:g}" for b in bases),
    ]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        plot_waveforms(bases, head_dim, out / "moice-bases.png")
        lines.append(f"waveforms in {out / 'moice-bases.png'}")
    if not prompts:
        return lines
    per_layer = torch.zeros(len(schemes), schemes[0].num_experts)
    for prompt in prompts:  # each prompt's prefill, every token and head, weighted equally per prompt
        gen.score(prompt, calibrate=False)
        per_layer += torch.stack([s.last_usage.cpu() for s in schemes]) / len(prompts)
    mean = per_layer.mean(0)
    lines.append(f"share of (token, head) routes per expert over {len(prompts)} prompts:")
    lines.append("  ".join(f"{b:g}: {m:.3f}" for b, m in zip(bases, mean.tolist(), strict=True)))
    if out is not None:
        record = {"method": gen.method.spec(), "n": len(prompts), "bases": bases, "per_layer": per_layer.tolist()}
        (out / "moice-usage.json").write_text(json.dumps({**record, "mean": mean.tolist()}, indent=1) + "\n")
        usage_heatmap(per_layer, bases, out / "moice-usage.png")
        lines.append(f"router usage in {out / 'moice-usage.json'}, heatmap {out / 'moice-usage.png'}")
    return lines
