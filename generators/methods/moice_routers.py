"""MoICE's trained part as an artefact: the routers of every layer and the expert bases they choose among.

`MoiceRouters` declares its section of meta.json (`SECTION`, "experts": the bases, the top_k it was trained with,
whether routers are per head) and saves and loads itself (`save(folder, meta)` /
`MoiceRouters.load(folder, model, method, base_model_sha256)`), as `LoRADelta` does for MuDAF. The method
(`generators.methods.moice`) and its trainer (`training.moice`) go through it, never through meta.json's keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from midlens.core.errors import MethodConfigError
from midlens.generators.artefacts import Artefact, Section, open_artefact, save_artefact
from midlens.generators.methods.moice import MoiceScheme, new_schemes, router_state
from midlens.generators.methods.rope_bases import rope_base


@dataclass
class MoiceRouters:
    """One MoICE scheme per layer (each holding its router), and whether the routers are per head."""

    schemes: list[MoiceScheme]
    per_head: bool = False

    SECTION = Section("experts", {"bases": list, "top_k": int, "per_head": bool})

    @classmethod
    def new(
        cls, model: nn.Module, bases: list[float], top_k: int, per_head: bool = False, seed: int = 0
    ) -> MoiceRouters:
        """Freshly initialised (untrained) routers for `model`, seeded."""
        return cls(new_schemes(model, bases, top_k, per_head, seed=seed), per_head)

    def config(self) -> dict:
        """This artefact's "experts" section: the bases (native first), top_k and per_head."""
        first = self.schemes[0]
        return {"bases": list(first.bases), "top_k": first.top_k, "per_head": self.per_head}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return router_state(self.schemes)

    def save(self, folder: str | Path, meta: dict) -> Path:
        """Save the routers as an artefact folder; `meta` gives the schema's other keys (method, base model, ...)."""
        return save_artefact(folder, self.state_dict(), {**meta, self.SECTION.key: self.config()})

    @classmethod
    def load(
        cls, folder: str | Path, model: nn.Module, method: str, base_model_sha256: str, top_k: int | None = None
    ) -> tuple[MoiceRouters, Artefact]:
        """The frozen routers saved in `folder` for `model` (mixing `top_k` experts per token, default: as trained),
        and the verified artefact. The folder is verified before its "experts" section is read."""
        artefact = open_artefact(folder, method, base_model_sha256)
        experts = cls.SECTION.read(artefact)
        bases = experts["bases"]
        top_k = top_k or experts["top_k"]
        if top_k > len(bases):
            raise MethodConfigError(
                f"moice top_k={top_k}: the routers in {artefact.path} choose among {len(bases)} experts."
            )
        native = rope_base(model.config)
        if abs(bases[0] - native) > 1e-6 * native:
            raise MethodConfigError(
                f"moice artefact {artefact.path}: its first expert base is {bases[0]:g}, but this model's RoPE base "
                f"is {native:g}; the routers were trained for another model."
            )
        routers = cls.new(model, bases, top_k, experts["per_head"])
        tensors = artefact.tensors_for({k: tuple(v.shape) for k, v in routers.state_dict().items()})
        for i, scheme in enumerate(routers.schemes):
            prefix = f"layers.{i}."
            scheme.router.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
            scheme.requires_grad_(False)
        return routers, artefact
