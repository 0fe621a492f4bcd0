"""Per-call weight deltas: what a trained method adds to the attention projections, without touching them.

A `WeightDelta` is asked, inside the attention module, for an extra term for each projection
(`q`, `k`, `v`, `o`) of each layer: `out = W x (+ b) + delta(x)`. It is installed per call like a scheme
or a probe, so a tuned method and the baseline share one loaded model and the shared weights are never
written. `LoRADelta` is the low-rank case (Hu et al. 2021): delta(x) = (alpha / r) * B A x with B = 0 at
initialisation, so a fresh delta is exactly the baseline. A trained `LoRADelta` is an artefact
(`core.saved_parts`): it declares its section of meta.json (`LoRADelta.SECTION`, "delta") and saves and loads
itself (`save(folder, meta)` / `LoRADelta.load(folder, method, base_model_sha256, model=model)`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from midlens.core.errors import ArtefactError
from midlens.core.saved_parts import Artefact, SavedPart, Section, train_step

PROJECTIONS = ("q", "k", "v", "o")


class WeightDelta(nn.Module):
    """Base class: adds nothing. Subclasses return [B, L, out] for the (layer, projection) pairs they change."""

    def project(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor | None:
        return None


def projection_shapes(model: nn.Module) -> dict[tuple[int, str], tuple[int, int]]:
    """(layer, projection) -> (in_features, out_features) of the model's attention projections."""
    shapes = {}
    cfg = model.config
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        fused = getattr(attn, "qkv_proj", None)  # Phi-3: one projection, [q | k | v]; a delta adds to each part
        for name in PROJECTIONS:
            if fused is not None and name != "o":
                heads = cfg.num_attention_heads if name == "q" else cfg.num_key_value_heads
                shapes[(i, name)] = (fused.in_features, heads * attn.head_dim)
                continue
            linear = getattr(attn, f"{name}_proj")
            shapes[(i, name)] = (linear.in_features, linear.out_features)
    return shapes


def _check_layers(model: nn.Module, layers: list[int]) -> None:
    """Refuse a delta for layers the model does not have: the delta was described (in a trained artefact's
    meta.json) for a deeper model, and building it would fail on the first missing layer's shape lookup."""
    count = len(model.model.layers)
    beyond = [i for i in layers if not 0 <= i < count]
    if beyond:
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ArtefactError(
            f"a LoRA delta for layers {layers[0]}-{layers[-1]} ({len(layers)} layers) does not fit model {name}: it "
            f"has {count} layers (0-{count - 1}), so layers {beyond[0]}-{beyond[-1]} do not exist. The delta (a "
            "MuDAF artefact's meta.json, delta.layers) was trained for another model: use an artefact trained for "
            "this one.",
            [train_step("mudaf")],
        )


class LoRADelta(WeightDelta, SavedPart):
    """Low-rank factors A [r, in], B [out, r] per targeted (layer, projection); trainable parameters."""

    # What a saved delta records to be rebuilt: meta.json's "delta" object ("parameters" is for people reading it).
    SECTION = Section(
        "delta",
        {
            "kind": str,
            "rank": int,
            "lora_alpha": (int, float),
            "projections": list,
            "layers": list,
            "parameters": int,
        },
    )

    def __init__(
        self,
        model: nn.Module,
        layers: Iterable[int],
        projections: Iterable[str] = ("q", "k"),
        rank: int = 8,
        alpha: float = 16.0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        shapes = projection_shapes(model)
        device = model.get_input_embeddings().weight.device
        self.layers = sorted(set(int(i) for i in layers))
        _check_layers(model, self.layers)
        self.projections = tuple(p for p in PROJECTIONS if p in set(projections))
        self.rank = int(rank)
        self.alpha = float(alpha)
        self.scaling = self.alpha / self.rank
        self.factors = nn.ParameterDict()
        for layer in self.layers:
            for name in self.projections:
                fan_in, fan_out = shapes[(layer, name)]
                a = torch.empty(self.rank, fan_in, dtype=dtype, device=device)
                nn.init.kaiming_uniform_(a, a=5**0.5)  # the LoRA paper's (and peft's) initialisation of A
                self.factors[f"{layer}_{name}_A"] = nn.Parameter(a)
                b = torch.zeros(fan_out, self.rank, dtype=dtype, device=device)  # B = 0: starts as the baseline
                self.factors[f"{layer}_{name}_B"] = nn.Parameter(b)
        self._targets = {(layer, name) for layer in self.layers for name in self.projections}

    def project(self, layer: int, name: str, x: torch.Tensor) -> torch.Tensor | None:
        if (layer, name) not in self._targets:
            return None
        a = self.factors[f"{layer}_{name}_A"]
        b = self.factors[f"{layer}_{name}_B"]
        return (x.to(a.dtype) @ a.T) @ b.T * self.scaling

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def config(self) -> dict:
        """This delta's section of meta.json: enough to build it again (`LoRADelta.load`)."""
        return {
            "kind": "lora",
            "rank": self.rank,
            "lora_alpha": self.alpha,
            "projections": list(self.projections),
            "layers": list(self.layers),
            "parameters": self.num_parameters(),
        }

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.state_dict()

    @classmethod
    def from_config(cls, section: dict, artefact: Artefact, model: nn.Module) -> LoRADelta:
        """A fresh delta for `model` with the layers, projections, rank and alpha the "delta" section records; its
        factors are what `load` then fills from the saved tensors."""
        if section["kind"] != "lora":
            raise ArtefactError(
                f"artefact {artefact.meta_file}: delta kind {section['kind']!r}; this midlens builds 'lora' deltas."
            )
        return cls(model, section["layers"], section["projections"], section["rank"], section["lora_alpha"])
