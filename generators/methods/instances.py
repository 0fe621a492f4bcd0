"""A batch whose prompts each run as several instances of the model (`context.Instances`): the rows laid out,
their logits mixed into one distribution per prompt, and the evidence of the mixture read back per prompt.

The generation loop stays one loop over prompts: it picks each prompt's token from the mixed logits and feeds
that token to all of the prompt's instance rows. Evidence is the instances' maps weighted by how much each
instance counted in the answer's distributions (their mixing weights, averaged over the answer's steps), so
a passage the deciding instance read carries the weight that instance had.
"""

from __future__ import annotations

import torch

from midlens.generators.attention.evidence import EvidenceMaps
from midlens.generators.methods.install import Instances
from midlens.generators.models.prompt import StackedPrompt

MAP_FIELDS = ("last", "question", "answer", "null_last", "null_question")


def expand(prompts: list[StackedPrompt], count: int) -> list[StackedPrompt]:
    """Each prompt `count` times in a row: row b * count + i is instance i of prompt b."""
    return [p for p in prompts for _ in range(count)]


class Mixture:
    """The mixing of one batch: logits per step, and the running sum of each prompt's instance weights."""

    def __init__(self, instances: Instances | None, prompts: int):
        self.instances = instances
        self.count = 1 if instances is None else instances.count
        self.weight_sum = torch.zeros(prompts, self.count)
        self.steps = torch.zeros(prompts)

    def rows(self, values: list) -> list:
        """Per-prompt values (tokens, references) repeated for every instance row."""
        return [v for v in values for _ in range(self.count)]

    def logits(self, row_logits: torch.Tensor, live: list[bool] | None = None) -> torch.Tensor:
        """[rows, ..., V] -> [prompts, ..., V]; counts the step's weights for the prompts still answering (`live`;
        default all)."""
        if self.instances is None:
            return row_logits
        grouped = row_logits.reshape(-1, self.count, *row_logits.shape[1:])
        mixed, weights = self.instances.mix(grouped)
        step_weights = weights.float().reshape(weights.shape[0], self.count, -1).mean(-1).cpu()
        taken = torch.ones(weights.shape[0], dtype=torch.bool) if live is None else torch.tensor(live)
        self.weight_sum[taken] += step_weights[taken]
        self.steps[taken] += 1
        return mixed

    def reference(self, row_logits: torch.Tensor) -> torch.Tensor:
        """Mixed logits of a teacher-forced pass (a reference answer scored): not a step of the answer, so its
        weights are not counted."""
        grouped = row_logits.reshape(-1, self.count, *row_logits.shape[1:])
        return self.instances.mix(grouped)[0]

    def weights(self, b: int) -> torch.Tensor:
        """Prompt b's instance weights, averaged over the steps it was mixed at (uniform before any step)."""
        if self.steps[b] == 0:
            return torch.full((self.count,), 1.0 / self.count)
        return self.weight_sum[b] / self.steps[b]

    def maps(self, row_maps: list[EvidenceMaps], b: int) -> EvidenceMaps:
        """Prompt b's evidence maps: its instances' maps, weighted."""
        own = row_maps[b * self.count : (b + 1) * self.count]
        if self.count == 1:
            return own[0]
        w = self.weights(b)
        fields = {}
        for name in MAP_FIELDS:
            values = [getattr(m, name) for m in own]
            missing = any(v is None for v in values)
            fields[name] = None if missing else sum(wi * v for wi, v in zip(w, values, strict=True))
        return EvidenceMaps(**fields)

    def mass(self, row_mass: list[torch.Tensor | None], b: int) -> torch.Tensor | None:
        """Prompt b's per-token attention over its passages' segments, its instances' weighted."""
        own = row_mass[b * self.count : (b + 1) * self.count]
        if any(m is None for m in own):
            return None
        if self.count == 1:
            return own[0]
        return sum(wi * m for wi, m in zip(self.weights(b), own, strict=True))
